/**
 * The per-cell widgets: the mode <select> (in Lab's cell toolbar and in each cell's strip)
 * and the strip under a code cell's input that says what the cell asks for and how its
 * last run went. Both render from the cell model and the run store, never from the DOM,
 * so a cell that a windowed notebook detached and re-attached renders the same.
 */
import type { ICellModel } from '@jupyterlab/cells';
import type { Message } from '@lumino/messaging';
import type { ISignal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { CHOICES, METADATA_KEY, isChoice, readMetadataMode } from './cellmode-model';
import type { CellRunStore, ICellRun, MetadataMode, ModeChoice } from './cellmode-model';
import { effectiveBadge } from './modes';

/** What the widgets need from the plugin. */
export interface ICellModeHost {
  readonly store: CellRunStore;
  /** Writes the cell's metadata for `choice` (removes the key for 'default'). */
  setMode(model: ICellModel, choice: ModeChoice): void;
  /** Whether the per-cell control is shown (the `showCellToolbar` setting). */
  readonly showControl: boolean;
  readonly settingsChanged: ISignal<unknown, void>;
}

const INVALID_VALUE = '__invalid__';

/** The text a cell's metadata mode shows in its control. */
export function choiceLabel(meta: MetadataMode): string {
  switch (meta.kind) {
    case 'default':
      return 'default';
    case 'mode':
      return meta.mode;
    case 'invalid':
      return `invalid: ${meta.raw}`;
  }
}

/** Makes `select` show `meta`: one option per choice, plus the invalid value when there is one. */
export function syncSelect(select: HTMLSelectElement, meta: MetadataMode): void {
  const wanted = [...CHOICES] as string[];
  if (meta.kind === 'invalid') {
    wanted.unshift(INVALID_VALUE);
  }
  const have = Array.from(select.options).map(o => o.value);
  if (have.join('|') !== wanted.join('|')) {
    select.textContent = '';
    for (const value of wanted) {
      const option = document.createElement('option');
      option.value = value;
      option.textContent = value === INVALID_VALUE ? choiceLabel(meta) : value;
      if (value === INVALID_VALUE) {
        option.disabled = true;
      }
      select.appendChild(option);
    }
  } else if (meta.kind === 'invalid') {
    select.options[0].textContent = choiceLabel(meta);
  }
  select.value = meta.kind === 'invalid' ? INVALID_VALUE : choiceLabel(meta);
  select.classList.toggle('shardlab-mod-invalid', meta.kind === 'invalid');
  select.dataset.mode = meta.kind === 'invalid' ? 'invalid' : choiceLabel(meta);
  select.title =
    meta.kind === 'invalid'
      ? `This cell's metadata shardlab.mode is ${meta.raw}, which is not a mode: the kernel ` +
        'will refuse the cell. Choose eager, jit or graph, or default to remove it.'
      : "This cell's mode (cell metadata shardlab.mode); a %%eager/%%jit/%%graph first " +
        'line takes precedence';
}

/** A <select> bound to one cell model's mode. */
function createModeSelect(
  model: ICellModel,
  host: ICellModeHost,
  className: string
): HTMLSelectElement {
  const select = document.createElement('select');
  select.className = className;
  select.setAttribute('aria-label', 'Cell mode');
  select.addEventListener('change', () => {
    if (isChoice(select.value)) {
      host.setMode(model, select.value);
    }
  });
  // Keys typed into the control (arrows, letters) are for it, not for the notebook's
  // command-mode shortcuts (Lumino skips bindings for targets inside this attribute).
  select.setAttribute('data-lm-suppress-shortcuts', 'true');
  return select;
}

/** "unknown mode 'grpah'" from the kernel's "cell metadata shardlab.mode: unknown mode 'grpah'; valid ...". */
export function shortError(message: string): string {
  const first = message.split('\n')[0];
  const body = first.includes(': ') ? first.slice(first.indexOf(': ') + 2) : first;
  return body.split(';')[0].trim() || first;
}

/** What the strip says about the last run, or '' when there is none. */
export function describeRun(run: ICellRun | undefined): { text: string; title: string; error: boolean } {
  if (!run) {
    return { text: '', title: '', error: false };
  }
  if (run.error) {
    return { text: `not run: ${shortError(run.error)}`, title: run.error, error: true };
  }
  if (run.mode === null) {
    return { text: '', title: '', error: false };
  }
  const badge = effectiveBadge(run.requested, run.mode, run.source, run.durationS);
  let text = `ran ${badge.text}`;
  if (badge.overridden) {
    text += ` · %%${run.mode} overrode ${run.requested ?? 'the metadata'}`;
  }
  const count = run.executionCount === null ? '' : `[${run.executionCount}] `;
  const title = count + badge.title;
  return { text, title, error: false };
}

/**
 * The strip under a code cell's input: the mode control and the last run's effective mode
 * and duration. Empty (and not displayed) for a cell with no mode set that has not run.
 */
export class CellModeStrip extends Widget {
  constructor(readonly model: ICellModel, private readonly _host: ICellModeHost) {
    super();
    this.addClass('shardlab-CellMode');
    this._select = createModeSelect(model, _host, 'shardlab-CellMode-select');
    this._run = document.createElement('span');
    this._run.className = 'shardlab-CellMode-run';
    this.node.append(this._select, this._run);
    model.metadataChanged.connect(this._onMetadata, this);
    _host.store.changed.connect(this._onRun, this);
    _host.settingsChanged.connect(this.render, this);
    this.render();
  }

  render(): void {
    if (this.isDisposed) {
      return;
    }
    const meta = readMetadataMode(this.model.getMetadata(METADATA_KEY));
    const run = describeRun(this._host.store.get(this.model.id));
    syncSelect(this._select, meta);
    this._select.hidden = !this._host.showControl;
    this._run.textContent = run.text;
    this._run.title = run.title;
    this._run.classList.toggle('shardlab-mod-error', run.error);
    const empty = meta.kind === 'default' && !run.text;
    this.toggleClass('shardlab-mod-empty', empty || (!this._host.showControl && !run.text));
    this.node.dataset.mode = meta.kind === 'invalid' ? 'invalid' : choiceLabel(meta);
    this.node.dataset.ran = this._host.store.get(this.model.id)?.mode ?? '';
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this.model.metadataChanged.disconnect(this._onMetadata, this);
    this._host.store.changed.disconnect(this._onRun, this);
    this._host.settingsChanged.disconnect(this.render, this);
    super.dispose();
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    this.render();
  }

  private _onMetadata(_: unknown, change: { key: string }): void {
    if (change.key === METADATA_KEY) {
      this.render();
    }
  }

  private _onRun(_: unknown, cellId: string): void {
    if (cellId === this.model.id) {
      this.render();
    }
  }

  private _select: HTMLSelectElement;
  private _run: HTMLSpanElement;
}

/** The mode control in Lab's cell toolbar (shown on the active code cell). */
export class CellModeToolbarItem extends Widget {
  constructor(
    readonly model: ICellModel,
    private readonly _host: ICellModeHost,
    private readonly _enabled: () => boolean
  ) {
    super();
    this.addClass('shardlab-CellModeToolbar');
    this._select = createModeSelect(model, _host, 'shardlab-CellModeToolbar-select');
    this.node.appendChild(this._select);
    model.metadataChanged.connect(this._onMetadata, this);
    _host.settingsChanged.connect(this.render, this);
    this.render();
  }

  render(): void {
    if (this.isDisposed) {
      return;
    }
    syncSelect(this._select, readMetadataMode(this.model.getMetadata(METADATA_KEY)));
    this.setHidden(this.model.type !== 'code' || !this._host.showControl || !this._enabled());
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this.model.metadataChanged.disconnect(this._onMetadata, this);
    this._host.settingsChanged.disconnect(this.render, this);
    super.dispose();
  }

  private _onMetadata(_: unknown, change: { key: string }): void {
    if (change.key === METADATA_KEY) {
      this.render();
    }
  }

  private _select: HTMLSelectElement;
}
