/**
 * The status bar item: default mode, device set, active mesh and live memory per device of
 * the current notebook's shardlab kernel; hidden for other kernels. A click opens the
 * shardlab panel (`shardlab:open-panel`, from panel.ts) when that command exists.
 */
import type { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import type { ISessionContext } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import type { NotebookPanel } from '@jupyterlab/notebook';
import type { Kernel } from '@jupyterlab/services';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { connectionFor } from './comm';
import type { ShardlabConnection } from './comm';
import { statusBarParts, statusTooltip } from './format';
import { OPEN_PANEL_COMMAND, SETTINGS_PLUGIN_ID } from './ids';
import type { IShardlabStatus } from './protocol';

const DEFAULT_REFRESH_MS = 2000;

/** The item's DOM: one span per part, so tests and styles can find them. */
export class ShardlabStatusWidget extends Widget {
  constructor(onClick: () => void) {
    super();
    this.addClass('jp-shardlab-status');
    this.node.setAttribute('role', 'button');
    this.node.dataset.shardlab = 'status';
    this.node.addEventListener('click', onClick);
    this.render(null);
  }

  render(status: IShardlabStatus | null): void {
    const node = this.node;
    node.textContent = '';
    if (status === null) {
      node.title = '';
      return;
    }
    statusBarParts(status).forEach(([name, text], index) => {
      if (index > 0) {
        node.appendChild(document.createTextNode(' · '));
      }
      const span = document.createElement('span');
      span.className = `jp-shardlab-status-${name}`;
      span.textContent = text;
      node.appendChild(span);
    });
    node.title = statusTooltip(status);
  }
}

/** Follows the current notebook's connection; shows its status while it is shardlab's. */
class StatusTracker {
  readonly activeStateChanged = new Signal<this, void>(this);

  constructor(
    readonly widget: ShardlabStatusWidget,
    tracker: INotebookTracker
  ) {
    tracker.currentChanged.connect((_, panel) => this._follow(panel), this);
    this._follow(tracker.currentWidget);
  }

  get isActive(): boolean {
    return this._connection?.isShardlab === true && this._connection.status !== null;
  }

  set refreshMs(value: number) {
    this._refreshMs = Number.isFinite(value) && value > 0 ? value : 0;
    this._updateTimer();
  }

  private _follow(panel: NotebookPanel | null): void {
    this._connection?.statusChanged.disconnect(this._onStatus, this);
    this._context?.statusChanged.disconnect(this._onKernelStatus, this);
    this._context = panel?.sessionContext ?? null;
    this._connection = this._context ? connectionFor(this._context) : null;
    this._connection?.statusChanged.connect(this._onStatus, this);
    this._context?.statusChanged.connect(this._onKernelStatus, this);
    this._onStatus();
  }

  private _onStatus(): void {
    this.widget.render(this.isActive ? this._connection!.status : null);
    this.activeStateChanged.emit();
    this._updateTimer();
  }

  private _onKernelStatus(_: ISessionContext, status: Kernel.Status): void {
    this._busy = status === 'busy';
    this._updateTimer();
  }

  /** Polls the status only while a shardlab kernel is busy, and never two at a time. */
  private _updateTimer(): void {
    const wanted = this._busy && this._refreshMs > 0 && this._connection?.isShardlab === true;
    if (!wanted && this._timer !== null) {
      window.clearInterval(this._timer);
      this._timer = null;
    } else if (wanted && this._timer === null) {
      this._timer = window.setInterval(() => this._poll(), this._refreshMs);
    }
  }

  private _poll(): void {
    const connection = this._connection;
    if (this._polling || connection === null || !connection.isShardlab) {
      return;
    }
    this._polling = true;
    connection
      .refresh()
      .catch(() => undefined)
      .then(() => {
        this._polling = false;
      });
  }

  private _context: ISessionContext | null = null;
  private _connection: ShardlabConnection | null = null;
  private _busy = false;
  private _refreshMs = DEFAULT_REFRESH_MS;
  private _timer: number | null = null;
  private _polling = false;
}

const statusbar: JupyterFrontEndPlugin<void> = {
  id: 'shardlab:statusbar',
  description: "The shardlab kernel's mode, devices, mesh and memory in the status bar.",
  autoStart: true,
  requires: [IStatusBar, INotebookTracker],
  optional: [ISettingRegistry],
  activate: (
    app: JupyterFrontEnd,
    statusBar: IStatusBar,
    tracker: INotebookTracker,
    settings: ISettingRegistry | null
  ): void => {
    const widget = new ShardlabStatusWidget(() => {
      if (app.commands.hasCommand(OPEN_PANEL_COMMAND)) {
        void app.commands.execute(OPEN_PANEL_COMMAND).catch(() => undefined);
      }
    });
    const state = new StatusTracker(widget, tracker);
    statusBar.registerStatusItem('shardlab:status', {
      item: widget,
      align: 'left',
      rank: 100,
      isActive: () => state.isActive,
      activeStateChanged: state.activeStateChanged
    });
    if (settings) {
      settings
        .load(SETTINGS_PLUGIN_ID)
        .then(loaded => {
          const apply = () => {
            state.refreshMs = loaded.get('refreshIntervalMs').composite as number;
          };
          apply();
          loaded.changed.connect(apply);
        })
        .catch(() => undefined);
    }
  }
};

export default statusbar;
