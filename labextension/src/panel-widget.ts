/**
 * The shardlab side panel: devices and the switch action, per-device memory bars with
 * Release, the largest arrays by name and sharding, and the last cells' modes. It shows
 * the status record of one connection (the current notebook's) and re-renders whenever
 * that connection's record changes.
 */
import { Clipboard } from '@jupyterlab/apputils';
import type { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import type { ShardlabConnection } from './comm';
import { formatBytes, gpuInstallCommand } from './format';
import type { IShardlabStatus } from './protocol';
import { MARGIN, MARKER_COLORS, MARKER_NAMES, memoryChart } from './memory-chart';
import {
  arrayRows,
  cpuCount,
  devicesLine,
  errorMessageOf,
  historyRows,
  memoryRows,
  memorySummary,
  pinnedLine,
  releaseLine
} from './panel-view';

type Child = Node | string | null | undefined | false;

/** `el('div.a.b', {title: 't'}, child, ...)`: an element with classes, attributes and children. */
function el(tag: string, attrs: Record<string, string> = {}, ...children: Child[]): HTMLElement {
  const [name, ...classes] = tag.split('.');
  const node = document.createElement(name);
  if (classes.length) {
    node.className = classes.join(' ');
  }
  for (const [key, value] of Object.entries(attrs)) {
    node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child !== null && child !== undefined && child !== false) {
      node.append(child);
    }
  }
  return node;
}

const SVG_NS = 'http://www.w3.org/2000/svg';

/** An SVG element with attributes and children (`title` children become tooltips). */
function svg(tag: string, attrs: Record<string, string | number> = {}, ...children: Node[]): SVGElement {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) {
    node.setAttribute(key, String(value));
  }
  node.append(...children);
  return node;
}

function svgTitle(text: string): SVGElement {
  const title = document.createElementNS(SVG_NS, 'title');
  title.textContent = text;
  return title;
}

/** "TFRT_CPU_3" → "3", "cuda:1" → "1": legend labels; the full name is the tooltip. */
function shortDevice(device: string): string {
  const match = /(\d+)\D*$/.exec(device);
  return match ? match[1] : device;
}

function empty(text: string): HTMLElement {
  return el('p.shardlab-Panel-empty', {}, text);
}

export class ShardlabPanel extends Widget {
  constructor() {
    super();
    this.addClass('shardlab-Panel');
    this.node.tabIndex = -1;
    this.render();
  }

  /** Shows `connection` (the current notebook's), or nothing. */
  setSource(connection: ShardlabConnection | null, label: string): void {
    if (connection === this._connection && label === this._label) {
      return;
    }
    this._connection?.statusChanged.disconnect(this._onStatus, this);
    this._connection = connection;
    this._label = label;
    this._message = null;
    this._cpuText = null;
    this._peak = 0;
    this._connection?.statusChanged.connect(this._onStatus, this);
    this.render();
    this._refresh();
  }

  dispose(): void {
    this._connection?.statusChanged.disconnect(this._onStatus, this);
    this._connection = null;
    super.dispose();
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._refresh();
  }

  private _onStatus(): void {
    if (this._connection?.status === null) {
      this._peak = 0; // the kernel restarted or went away
    }
    this.render();
  }

  /** Asks the kernel for a fresh record when the panel is visible and connected. */
  private _refresh(): void {
    const connection = this._connection;
    if (connection?.isShardlab && this.isVisible) {
      connection.refresh().catch(() => undefined); // the kernel pushes the record anyway
    }
  }

  render(): void {
    if (this.isDisposed) {
      return;
    }
    const status = this._connection?.status ?? null;
    const title = el(
      'div.shardlab-Panel-title',
      {},
      'shardlab',
      el('span.shardlab-Panel-source', {}, this._label)
    );
    const body: Child[] = [title];
    if (this._connection === null) {
      body.push(empty('Open a notebook on the shardlab kernel to see its devices and memory.'));
    } else if (!this._connection.isShardlab) {
      body.push(
        empty(
          'Not a shardlab kernel: nothing to show. Choose the “JAX · shardlab” kernel for ' +
            'this notebook to see its devices, memory and cell modes.'
        )
      );
    } else if (status === null) {
      body.push(empty('Waiting for the kernel’s status…'));
    } else {
      body.push(this._devices(status), this._memory(status), this._arrays(status), this._history(status));
    }
    this.node.replaceChildren(...body.filter((c): c is Node | string => !!c));
  }

  private _section(name: string, title: string, ...children: Child[]): HTMLElement {
    return el(`section.shardlab-Panel-section.shardlab-Panel-${name}`, {}, el('h3', {}, title), ...children);
  }

  private _devices(status: IShardlabStatus): HTMLElement {
    const input = el('input.shardlab-Panel-cpuCount', {
      type: 'number',
      min: '1',
      max: '4096',
      value: this._cpuText ?? String(status.devices.platform === 'cpu' ? status.devices.count : 8),
      'aria-label': 'Number of CPU devices'
    }) as HTMLInputElement;
    input.addEventListener('input', () => {
      this._cpuText = input.value; // kept when a new status re-renders the panel
    });
    const button = el(
      'button.jp-mod-styled.shardlab-Panel-switch',
      { type: 'button' },
      'Switch'
    ) as HTMLButtonElement;
    const onSwitch = (): void => {
      const parsed = cpuCount(input.value);
      if ('error' in parsed) {
        this._show('switch', parsed.error, true);
        return;
      }
      this._run(button, 'switch', async connection => {
        const result = await connection.switchDevices(`cpu:${parsed.count}`);
        return { text: result.text, error: !result.ok };
      });
    };
    button.addEventListener('click', onSwitch);
    input.addEventListener('keydown', event => {
      if (event.key === 'Enter') {
        onSwitch();
      }
    });
    const command = gpuInstallCommand('gpu:0,1');
    const copy = el(
      'button.jp-mod-styled.shardlab-Panel-copy',
      { type: 'button', title: 'Copy the command' },
      'Copy'
    );
    copy.addEventListener('click', () => Clipboard.copyToSystem(command));
    return this._section(
      'devices',
      'Devices',
      el('div.shardlab-Panel-line.shardlab-Panel-deviceSet', {}, devicesLine(status)),
      el('div.shardlab-Panel-line.shardlab-Panel-pinned', {}, pinnedLine(status)),
      el(
        'div.shardlab-Panel-form',
        {},
        el('label', {}, 'CPU devices ', input),
        button,
        el('span.shardlab-Panel-hint', {}, 'moves every array, keeps names')
      ),
      this._messageNode('switch'),
      el(
        'p.shardlab-Panel-hint',
        {},
        'GPU sets are fixed when the kernel starts: install a kernel for the set, then pick ' +
          'it (Kernel › Change Kernel):'
      ),
      el('div.shardlab-Panel-command', {}, el('code', {}, command), copy)
    );
  }

  private _memory(status: IShardlabStatus): HTMLElement {
    const most = Object.values(status.bytes_per_device).reduce((a, b) => Math.max(a, b), 0);
    this._peak = Math.max(this._peak, most);
    const rows = memoryRows(status.bytes_per_device, this._peak).map(row =>
      el(
        'div.shardlab-Panel-bar',
        { title: `${row.device}: ${row.bytes.toLocaleString()} bytes` },
        el('span.shardlab-Panel-device', {}, row.device),
        el(
          'span.shardlab-Panel-track',
          {},
          el('span.shardlab-Panel-fill', { style: `width: ${(row.fraction * 100).toFixed(1)}%` })
        ),
        el('span.shardlab-Panel-bytes', {}, row.text)
      )
    );
    const release = el(
      'button.jp-mod-styled.jp-mod-accept.shardlab-Panel-release',
      { type: 'button', title: 'Clear output history, caches and unnamed arrays (%release)' },
      'Release'
    ) as HTMLButtonElement;
    release.addEventListener('click', () =>
      this._run(release, 'release', async connection => {
        const result = await connection.release();
        return { text: releaseLine(result), details: result.text, error: false };
      })
    );
    return this._section(
      'memory',
      'Memory per device',
      el(
        'div.shardlab-Panel-line.shardlab-Panel-total',
        {
          title:
            `bars: share of ${formatBytes(this._peak)}, the most one device held ` +
            'since the panel followed this kernel'
        },
        memorySummary(status.bytes_per_device)
      ),
      el('div.shardlab-Panel-bars', {}, ...rows),
      this._chart(status),
      el('div.shardlab-Panel-form', {}, release),
      this._messageNode('release')
    );
  }

  /** Live bytes per device over time: a line per device, dashed lines at markers. */
  private _chart(status: IShardlabStatus): HTMLElement | null {
    const history = status.memory_history;
    const chart = history ? memoryChart(history) : null;
    if (!history || !chart) {
      return null;
    }
    const { width, height } = chart;
    const plot = svg(
      'svg',
      {
        class: 'shardlab-Panel-chart',
        width,
        height,
        viewBox: `0 0 ${width} ${height}`,
        role: 'img',
        'aria-label': `live bytes per device over time: ${chart.summary}`
      },
      ...chart.yTicks.map(tick =>
        svg(
          'g',
          { class: 'shardlab-Panel-chartTick' },
          svg('line', { x1: MARGIN.left, x2: width - MARGIN.right, y1: tick.y, y2: tick.y }),
          Object.assign(svg('text', { x: MARGIN.left - 4, y: tick.y + 3, 'text-anchor': 'end' }), {
            textContent: tick.label
          })
        )
      ),
      Object.assign(svg('text', { class: 'shardlab-Panel-chartAxis', x: MARGIN.left, y: height - 3 }), {
        textContent: chart.xLabels[0]
      }),
      Object.assign(
        svg('text', {
          class: 'shardlab-Panel-chartAxis',
          x: width - MARGIN.right,
          y: height - 3,
          'text-anchor': 'end'
        }),
        { textContent: chart.xLabels[1] }
      ),
      ...chart.markers.map(marker =>
        svg(
          'line',
          {
            class: 'shardlab-Panel-chartMarker',
            'data-kind': marker.kind,
            x1: marker.x,
            x2: marker.x,
            y1: MARGIN.top,
            y2: height - MARGIN.bottom,
            stroke: marker.color
          },
          svgTitle(marker.title)
        )
      ),
      ...chart.lines.map(line =>
        svg(
          'g',
          { class: 'shardlab-Panel-chartLine', 'data-device': line.device },
          svgTitle(
            `${line.device}: now ${line.last === null ? 'absent' : formatBytes(line.last)}, ` +
              `peak ${formatBytes(line.peak)}`
          ),
          ...line.segments.map(points =>
            svg('polyline', { points, fill: 'none', stroke: line.color })
          )
        )
      )
    );
    const kinds = [...new Set(chart.markers.map(m => m.kind))];
    const legend = el(
      'div.shardlab-Panel-legend',
      {},
      ...chart.lines.map(line =>
        el(
          'span.shardlab-Panel-legendItem',
          { title: line.device },
          el('span.shardlab-Panel-swatch', { style: `background: ${line.color}` }),
          shortDevice(line.device)
        )
      ),
      ...kinds.map(kind =>
        el(
          'span.shardlab-Panel-legendItem',
          {},
          el('span.shardlab-Panel-markerSwatch', {
            style: `border-color: ${MARKER_COLORS[kind] ?? '#888888'}`
          }),
          MARKER_NAMES[kind] ?? kind
        )
      )
    );
    return el(
      'div.shardlab-Panel-overTime',
      {},
      el('div.shardlab-Panel-hint', {}, 'Over time · ', chart.summary),
      plot,
      legend
    );
  }

  private _arrays(status: IShardlabStatus): HTMLElement {
    const rows = arrayRows(status.largest_arrays);
    if (rows.length === 0) {
      const none = el('p.shardlab-Panel-hint', {}, 'No named arrays yet.');
      return this._section('arrays', 'Largest arrays', none);
    }
    const list = el(
      'ul.shardlab-Panel-arrayList',
      {},
      ...rows.map(r =>
        el(
          'li.shardlab-Panel-array',
          { title: `${r.name}: ${r.type}, ${r.sharding}, ${r.perDevice} per device` },
          el(
            'div.shardlab-Panel-arrayHead',
            {},
            el('span.shardlab-Panel-name', {}, r.name),
            el('span.shardlab-Panel-num', {}, `${r.perDevice}/device`)
          ),
          el('div.shardlab-Panel-hint.shardlab-Panel-arrayType', {}, `${r.type} · ${r.sharding}`)
        )
      )
    );
    return this._section('arrays', 'Largest arrays', list);
  }

  private _history(status: IShardlabStatus): HTMLElement {
    const rows = historyRows(status.history);
    const body = rows.length
      ? el(
          'table.shardlab-Panel-table.shardlab-Panel-historyTable',
          {},
          el(
            'tbody',
            {},
            ...rows.map(r =>
              el(
                'tr',
                {},
                el('td.shardlab-Panel-num', {}, r.count),
                el('td', {}, r.mode),
                el('td.shardlab-Panel-num', {}, r.duration),
                el('td.shardlab-Panel-hint', {}, r.source)
              )
            )
          )
        )
      : el('p.shardlab-Panel-hint', {}, 'No cells have run yet.');
    return this._section('history', `Recent cells · default ${status.default_mode}`, body);
  }

  private _messageNode(key: string): HTMLElement | null {
    const message = this._message;
    if (!message || message.key !== key) {
      return null;
    }
    return el(
      `div.shardlab-Panel-message${message.error ? '.shardlab-mod-error' : ''}`,
      { 'data-action': key },
      el('div.shardlab-Panel-messageText', {}, message.text),
      message.details &&
        el('details', {}, el('summary', {}, 'details'), el('pre', {}, message.details))
    );
  }

  private _show(key: string, text: string, error: boolean, details = ''): void {
    this._message = { key, text, error, details };
    this.render();
  }

  /** Runs one action on the connection; its result (or error) shows under its button. */
  private _run(
    button: HTMLButtonElement,
    key: string,
    action: (
      connection: ShardlabConnection
    ) => Promise<{ text: string; error: boolean; details?: string }>
  ): void {
    const connection = this._connection;
    if (!connection) {
      return;
    }
    button.disabled = true;
    action(connection)
      .then(
        result => this._show(key, result.text, result.error, result.details),
        (error: unknown) => this._show(key, errorMessageOf(error), true)
      )
      .finally(() => {
        button.disabled = false;
      });
  }

  private _connection: ShardlabConnection | null = null;
  private _label = '';
  private _cpuText: string | null = null;
  private _message: { key: string; text: string; error: boolean; details: string } | null =
    null;
  /** The most bytes one device held since the panel followed this connection. */
  private _peak = 0;
}
