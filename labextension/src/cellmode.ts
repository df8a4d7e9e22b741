/**
 * Per-cell modes in JupyterLab: a mode control in the cell toolbar and in a strip under
 * each code cell's input, the command `shardlab:set-cell-mode` (palette, shortcuts), and
 * after a run the effective mode and duration from the kernel's execute reply.
 *
 * A cell's mode is its metadata `shardlab.mode` (absent for "default"); the kernel reads it
 * with each execute request and answers with the effective mode in the reply's metadata.
 */
import type { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, IToolbarWidgetRegistry } from '@jupyterlab/apputils';
import type { Cell, ICellModel } from '@jupyterlab/cells';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import type { Widget } from '@lumino/widgets';
import { Signal } from '@lumino/signaling';

import { CHOICES, CellRunStore, METADATA_KEY, isChoice, metadataFor, readMetadataMode } from './cellmode-model';
import type { ModeChoice } from './cellmode-model';
import { NotebookCellModes } from './cellmode-notebook';
import type { INotebookModesHost } from './cellmode-notebook';
import { CellModeToolbarItem } from './cellmode-widgets';
import { connectionFor } from './comm';
import { SETTINGS_PLUGIN_ID } from './ids';

export const SET_CELL_MODE = 'shardlab:set-cell-mode';
/** The cell toolbar item's name (`jupyter.lab.toolbars.Cell` in schema/cellmode.json). */
export const TOOLBAR_ITEM = 'shardlab-mode';
const CATEGORY = 'shardlab';

/** Settings, notebooks and the run store, shared by every notebook's cells. */
class CellModes implements INotebookModesHost {
  readonly store = new CellRunStore();
  showControl = true;
  defaultChoice: ModeChoice = 'default';
  readonly notebooks = new Map<NotebookPanel, NotebookCellModes>();

  get settingsChanged(): Signal<this, void> {
    return this._settingsChanged;
  }

  setMode(model: ICellModel, choice: ModeChoice): void {
    const entry = metadataFor(choice, model.getMetadata(METADATA_KEY));
    if (entry === undefined) {
      model.deleteMetadata(METADATA_KEY);
    } else {
      model.setMetadata(METADATA_KEY, entry);
    }
  }

  shardlabChanged(): void {
    this._settingsChanged.emit();
  }

  applySettings(settings: ISettingRegistry.ISettings): void {
    const show = settings.get('showCellToolbar').composite;
    const choice = settings.get('defaultCellMode').composite;
    this.showControl = show !== false;
    this.defaultChoice = isChoice(choice) ? choice : 'default';
    this._settingsChanged.emit();
  }

  /** Whether `widget` (a cell) sits in a notebook on a shardlab kernel. */
  onShardlab(widget: Widget): boolean {
    let node: Widget | null = widget;
    while (node && !(node instanceof NotebookPanel)) {
      node = node.parent;
    }
    return node instanceof NotebookPanel && !!this.notebooks.get(node)?.active;
  }

  private _settingsChanged = new Signal<this, void>(this);
}

/** The code cells a command acts on: the selected ones, or the active one. */
function targetCells(tracker: INotebookTracker): Cell[] {
  const notebook = tracker.currentWidget?.content;
  if (!notebook) {
    return [];
  }
  const cells = notebook.widgets.filter(c => notebook.isSelectedOrActive(c));
  return cells.filter(c => c.model.type === 'code');
}

function activate(
  app: JupyterFrontEnd,
  tracker: INotebookTracker,
  settingRegistry: ISettingRegistry | null,
  toolbarRegistry: IToolbarWidgetRegistry | null,
  palette: ICommandPalette | null
): void {
  const modes = new CellModes();

  tracker.widgetAdded.connect((_, panel) => {
    const notebook = new NotebookCellModes(panel, connectionFor(panel.sessionContext), modes);
    modes.notebooks.set(panel, notebook);
    panel.disposed.connect(() => {
      notebook.dispose();
      modes.notebooks.delete(panel);
    });
  });

  if (settingRegistry) {
    void settingRegistry
      .load(SETTINGS_PLUGIN_ID)
      .then(settings => {
        modes.applySettings(settings);
        settings.changed.connect(() => modes.applySettings(settings));
      })
      .catch(error => console.error('shardlab: cell mode settings not loaded:', error));
  }

  toolbarRegistry?.addFactory<Cell>(
    'Cell',
    TOOLBAR_ITEM,
    cell => new CellModeToolbarItem(cell.model, modes, () => modes.onShardlab(cell))
  );

  /** The active cell's choice, for the no-argument form (a menu entry): it cycles. */
  const currentChoice = (): ModeChoice => {
    const model = tracker.currentWidget?.content.activeCell?.model;
    const meta = readMetadataMode(model?.getMetadata(METADATA_KEY));
    return meta.kind === 'mode' ? meta.mode : 'default';
  };
  const nextChoice = (): ModeChoice =>
    CHOICES[(CHOICES.indexOf(currentChoice()) + 1) % CHOICES.length];

  app.commands.addCommand(SET_CELL_MODE, {
    label: args =>
      isChoice(args.mode)
        ? `Set Cell Mode: ${args.mode}`
        : `Cycle Cell Mode (${currentChoice()} → ${nextChoice()})`,
    caption: args =>
      args.mode === 'default'
        ? "Removes the selected cells' mode (shardlab.mode metadata): they run in the session default"
        : isChoice(args.mode)
          ? `Runs the selected cells in ${args.mode} mode (cell metadata shardlab.mode)`
          : "Sets the selected cells' mode to the next of default, eager, jit, graph",
    describedBy: {
      args: {
        type: 'object',
        properties: { mode: { type: 'string', enum: [...CHOICES] } }
      }
    },
    isEnabled: () => targetCells(tracker).length > 0,
    isToggled: args => {
      const cells = targetCells(tracker);
      return (
        cells.length > 0 &&
        cells.every(c => {
          const meta = readMetadataMode(c.model.getMetadata(METADATA_KEY));
          return (meta.kind === 'mode' ? meta.mode : meta.kind) === args.mode;
        })
      );
    },
    execute: args => {
      const choice = args.mode === undefined ? nextChoice() : args.mode;
      if (!isChoice(choice)) {
        throw new Error(
          `${SET_CELL_MODE}: mode ${JSON.stringify(choice)} is not one of ${CHOICES.join(', ')}`
        );
      }
      for (const cell of targetCells(tracker)) {
        modes.setMode(cell.model, choice);
      }
    }
  });
  for (const mode of CHOICES) {
    palette?.addItem({ command: SET_CELL_MODE, args: { mode }, category: CATEGORY });
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'shardlab:cellmode',
  description: 'Per-cell execution modes (eager, jit, graph) and their effective mode after a run.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ISettingRegistry, IToolbarWidgetRegistry, ICommandPalette],
  activate
};

export default plugin;
