/**
 * One notebook panel's per-cell modes: a strip in each code cell (added when the cell is
 * first rendered, so windowed notebooks work), the execute replies of its kernel paired
 * with their cells, and the default mode for new cells. Only on a shardlab kernel: on any
 * other kernel the panel gets no strips and nothing is logged.
 */
import type { Cell, ICellModel } from '@jupyterlab/cells';
import type { CellList, NotebookPanel } from '@jupyterlab/notebook';
import type { Kernel } from '@jupyterlab/services';
import type { IObservableList } from '@jupyterlab/observables';
import type { IDisposable } from '@lumino/disposable';
import type { PanelLayout } from '@lumino/widgets';

import { METADATA_KEY, ReplyTracker, readMetadataMode } from './cellmode-model';
import type { IMessageLike, ModeChoice } from './cellmode-model';
import { CellModeStrip } from './cellmode-widgets';
import type { ICellModeHost } from './cellmode-widgets';
import type { ShardlabConnection } from './comm';

export interface INotebookModesHost extends ICellModeHost {
  /** The mode new code cells get (`defaultCellMode`); 'default' writes nothing. */
  readonly defaultChoice: ModeChoice;
  /** Called when the panel starts or stops being on a shardlab kernel. */
  shardlabChanged(panel: NotebookPanel): void;
}

const INPUT_WRAPPER_CLASS = 'jp-Cell-inputWrapper';

export class NotebookCellModes implements IDisposable {
  constructor(
    readonly panel: NotebookPanel,
    private readonly _connection: ShardlabConnection,
    private readonly _host: INotebookModesHost
  ) {
    this._replies = new ReplyTracker(_host.store);
    const context = panel.sessionContext;
    context.kernelChanged.connect(this._onKernel, this);
    context.statusChanged.connect(this._onStatus, this);
    _connection.statusChanged.connect(this._update, this);
    panel.content.modelChanged.connect(this._onModel, this);
    panel.content.cellInViewportChanged.connect(this._onCellShown, this);
    this._onKernel();
    this._onModel();
    void panel.context.ready.then(() => {
      this._loaded = true;
      this._update();
    });
  }

  /** Whether the panel's kernel is a shardlab kernel (its strips are shown). */
  get active(): boolean {
    return this._active;
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    const context = this.panel.sessionContext;
    context.kernelChanged.disconnect(this._onKernel, this);
    context.statusChanged.disconnect(this._onStatus, this);
    this._connection.statusChanged.disconnect(this._update, this);
    this.panel.content.modelChanged.disconnect(this._onModel, this);
    this.panel.content.cellInViewportChanged.disconnect(this._onCellShown, this);
    this._cells?.changed.disconnect(this._onCells, this);
    this._kernel?.anyMessage.disconnect(this._onMessage, this);
    this._removeStrips();
  }

  private _update(): void {
    if (this._isDisposed) {
      return;
    }
    // A restart closes the comm for a moment: the same kernel keeps its strips meanwhile.
    if (this._connection.isShardlab) {
      this._shardlabKernel = this._kernel;
    }
    const active =
      this._connection.isShardlab || (this._kernel !== null && this._kernel === this._shardlabKernel);
    if (active !== this._active) {
      this._active = active;
      this.panel.toggleClass('shardlab-mod-kernel', active);
      if (!active) {
        this._removeStrips();
      }
      this._host.shardlabChanged(this.panel);
    }
    if (active) {
      this._decorate();
    }
  }

  private _onKernel(): void {
    this._kernel?.anyMessage.disconnect(this._onMessage, this);
    this._kernel = this.panel.sessionContext.session?.kernel ?? null;
    this._kernel?.anyMessage.connect(this._onMessage, this);
    this._replies.reset();
    this._update();
  }

  private _onStatus(_: unknown, status: Kernel.Status): void {
    if (status === 'restarting' || status === 'autorestarting' || status === 'dead') {
      this._replies.reset(); // a restarted kernel never answers the requests in flight
    }
  }

  private _onMessage(_: unknown, args: Kernel.IAnyMessageArgs): void {
    this._replies.onMessage(args.msg as IMessageLike, args.direction);
  }

  private _onModel(): void {
    this._cells?.changed.disconnect(this._onCells, this);
    this._cells = this.panel.content.model?.cells ?? null;
    this._cells?.changed.connect(this._onCells, this);
    this._update();
  }

  private _onCells(_: unknown, change: IObservableList.IChangedArgs<ICellModel>): void {
    if (change.type === 'add' && this._loaded && this._active) {
      this._applyDefault(change.newValues);
    }
    // The notebook creates the cells' widgets in its own handler of this signal.
    void Promise.resolve().then(() => this._update());
  }

  private _onCellShown(_: unknown, cell: Cell): void {
    if (this._active && !this._strips.has(cell)) {
      this._decorate();
    }
  }

  /** New, empty code cells get the `defaultCellMode` setting's mode. */
  private _applyDefault(models: readonly ICellModel[]): void {
    const choice = this._host.defaultChoice;
    if (choice === 'default') {
      return;
    }
    for (const model of models) {
      if (
        model.type === 'code' &&
        model.sharedModel.getSource() === '' &&
        readMetadataMode(model.getMetadata(METADATA_KEY)).kind === 'default'
      ) {
        this._host.setMode(model, choice);
      }
    }
  }

  private _decorate(): void {
    for (const cell of this.panel.content.widgets) {
      if (cell.model.type !== 'code' || this._strips.has(cell)) {
        continue;
      }
      this._strips.set(cell, null);
      void cell.ready.then(() => this._insert(cell));
    }
  }

  private _insert(cell: Cell): void {
    if (cell.isDisposed || this._isDisposed || !this._active || this._strips.get(cell)) {
      if (cell.isDisposed || !this._active) {
        this._strips.delete(cell);
      }
      return;
    }
    const layout = cell.layout as PanelLayout;
    const index = layout.widgets.findIndex(w => w.hasClass(INPUT_WRAPPER_CLASS));
    const strip = new CellModeStrip(cell.model, this._host);
    layout.insertWidget(index < 0 ? layout.widgets.length : index + 1, strip);
    this._strips.set(cell, strip);
    cell.disposed.connect(this._onCellDisposed, this);
  }

  private _onCellDisposed(cell: Cell): void {
    this._strips.delete(cell);
  }

  private _removeStrips(): void {
    for (const [cell, strip] of this._strips) {
      cell.disposed.disconnect(this._onCellDisposed, this);
      strip?.dispose();
    }
    this._strips.clear();
  }

  private _active = false;
  private _loaded = false;
  private _isDisposed = false;
  private _kernel: Kernel.IKernelConnection | null = null;
  /** The last kernel seen with a shardlab comm. */
  private _shardlabKernel: Kernel.IKernelConnection | null = null;
  private _cells: CellList | null = null;
  private _replies: ReplyTracker;
  private _strips = new Map<Cell, CellModeStrip | null>();
}
