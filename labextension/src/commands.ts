/**
 * The shardlab commands, the "shardlab" main menu and the palette entries. This is the
 * plugin that bears the settings (`shardlab:plugin`, labextension/schema/plugin.json).
 *
 * Commands act on the current notebook's kernel through its `ShardlabConnection`; the
 * other plugins' commands (`shardlab:set-cell-mode`, `shardlab:open-panel`) join the menu
 * when they are registered.
 */
import type { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import {
  Clipboard,
  Dialog,
  ICommandPalette,
  InputDialog,
  Notification,
  showDialog
} from '@jupyterlab/apputils';
import { IMainMenu } from '@jupyterlab/mainmenu';
import { INotebookTracker } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { Menu, Widget } from '@lumino/widgets';

import { connectionFor } from './comm';
import type { ShardlabConnection } from './comm';
import { formatBytes, gpuInstallCommand, parseDeviceSpec } from './format';
import { OPEN_PANEL_COMMAND, SETTINGS_PLUGIN_ID, SET_CELL_MODE_COMMAND } from './ids';
import { MODES, isMode, nextMode, setModeMagicLine } from './modes';
import type { Mode } from './modes';

export const CommandIDs = {
  setDefaultMode: 'shardlab:set-default-mode',
  releaseMemory: 'shardlab:release-memory',
  switchDevices: 'shardlab:switch-devices',
  insertGraphLine: 'shardlab:insert-graph-line',
  insertEagerLine: 'shardlab:insert-eager-line'
} as const;

const CATEGORY = 'shardlab';

function textBody(text: string): Widget {
  const body = new Widget({ node: document.createElement('pre') });
  body.addClass('jp-shardlab-dialog-text');
  body.node.textContent = text;
  return body;
}

function reportError(title: string, error: unknown): void {
  const message = error instanceof Error ? error.message : String(error);
  Notification.error(`${title}: ${message}`, { autoClose: 8000 });
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: SETTINGS_PLUGIN_ID,
  description: 'shardlab commands (modes, memory, devices), its menu and its settings.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [IMainMenu, ICommandPalette, ISettingRegistry],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    mainMenu: IMainMenu | null,
    palette: ICommandPalette | null,
    settings: ISettingRegistry | null
  ): void => {
    const { commands } = app;

    /** The current notebook's connection if it talks to a shardlab kernel. */
    const connection = (): ShardlabConnection | null => {
      const panel = tracker.currentWidget;
      if (!panel) {
        return null;
      }
      const found = connectionFor(panel.sessionContext);
      return found.isShardlab ? found : null;
    };
    const isShardlab = () => connection() !== null;
    const activeCodeCell = () => {
      const cell = tracker.activeCell;
      return cell && cell.model.type === 'code' ? cell : null;
    };

    commands.addCommand(CommandIDs.setDefaultMode, {
      label: args =>
        isMode(args.mode) ? `Default Mode: ${args.mode}` : 'Set the Default Mode…',
      caption: 'The mode of cells without a %%mode line or mode metadata (%mode in the kernel)',
      isEnabled: isShardlab,
      isToggled: args => isMode(args.mode) && connection()?.status?.default_mode === args.mode,
      execute: async args => {
        const conn = connection();
        if (conn === null) {
          return;
        }
        let mode: Mode | null = isMode(args.mode) ? args.mode : null;
        if (mode === null && args.cycle === true) {
          mode = nextMode(conn.status?.default_mode ?? 'jit');
        }
        if (mode === null) {
          const current = conn.status?.default_mode ?? 'jit';
          const result = await InputDialog.getItem({
            title: 'shardlab: default mode',
            label: 'Cells without a %%mode line or mode metadata run in',
            items: [...MODES],
            current: MODES.indexOf(current)
          });
          if (!result.button.accept || !isMode(result.value)) {
            return;
          }
          mode = result.value;
        }
        try {
          await conn.setDefaultMode(mode);
        } catch (error) {
          reportError('shardlab: setting the default mode failed', error);
        }
      }
    });

    commands.addCommand(CommandIDs.releaseMemory, {
      label: 'Release Memory',
      caption: 'Clear output history and caches, delete unreachable arrays (%release)',
      isEnabled: isShardlab,
      execute: async () => {
        const conn = connection();
        if (conn === null) {
          return;
        }
        try {
          const result = await conn.release();
          const freed = Math.max(0, result.before - result.after);
          await showDialog({
            title: `shardlab: released ${formatBytes(freed)} of device memory`,
            body: textBody(result.text),
            buttons: [Dialog.okButton()]
          });
        } catch (error) {
          reportError('shardlab: release failed', error);
        }
      }
    });

    const showGpuAdvice = async (spec: string, kernelText?: string) => {
      const command = gpuInstallCommand(spec);
      const text =
        (kernelText ? kernelText + '\n\n' : '') +
        'GPU visibility is fixed when JAX starts. Install a kernelspec pinned to that set, ' +
        'then restart with it (Kernel › Change Kernel):\n\n' +
        command;
      const result = await showDialog({
        title: `shardlab: ${spec} needs a kernel restart`,
        body: textBody(text),
        buttons: [Dialog.cancelButton({ label: 'Close' }), Dialog.okButton({ label: 'Copy Command' })]
      });
      if (result.button.accept) {
        Clipboard.copyToSystem(command);
      }
    };

    commands.addCommand(CommandIDs.switchDevices, {
      label: 'Switch Devices…',
      caption: 'Change the number of simulated CPU devices in the running kernel (%devices cpu:N)',
      isEnabled: isShardlab,
      execute: async args => {
        const conn = connection();
        if (conn === null) {
          return;
        }
        let text = typeof args.spec === 'string' ? args.spec : null;
        if (text === null) {
          const count = conn.status?.devices.count ?? 8;
          const result = await InputDialog.getText({
            title: 'shardlab: switch devices',
            label: 'Device set: cpu:N switches in this kernel; gpu:I,J or gpu:all needs a restart',
            placeholder: 'cpu:4',
            text: `cpu:${count}`
          });
          if (!result.button.accept || !result.value) {
            return;
          }
          text = result.value;
        }
        const spec = parseDeviceSpec(text);
        if (spec === null) {
          Notification.warning(
            `shardlab: ${JSON.stringify(text)} is not a device set; use cpu:N, gpu:I,J or gpu:all`,
            { autoClose: 8000 }
          );
          return;
        }
        if (spec.platform === 'gpu') {
          await showGpuAdvice(spec.spec);
          return;
        }
        try {
          const result = await conn.switchDevices(spec.spec);
          if (result.ok) {
            Notification.success(`shardlab: switched to ${spec.spec}`, { autoClose: 5000 });
            await showDialog({
              title: `shardlab: ${spec.spec}`,
              body: textBody(result.text),
              buttons: [Dialog.okButton()]
            });
          } else {
            await showDialog({
              title: `shardlab: ${spec.spec} refused`,
              body: textBody(result.text),
              buttons: [Dialog.okButton()]
            });
          }
        } catch (error) {
          reportError('shardlab: switching devices failed', error);
        }
      }
    });

    const insertLine = (mode: Mode) => () => {
      const cell = activeCodeCell();
      if (cell === null) {
        return;
      }
      const shared = cell.model.sharedModel;
      shared.setSource(setModeMagicLine(shared.getSource(), mode));
    };
    commands.addCommand(CommandIDs.insertGraphLine, {
      label: 'Insert %%graph Line',
      caption: "Make the active cell's first line %%graph (replacing a mode line)",
      isEnabled: () => activeCodeCell() !== null,
      execute: insertLine('graph')
    });
    commands.addCommand(CommandIDs.insertEagerLine, {
      label: 'Insert %%eager Line',
      caption: "Make the active cell's first line %%eager (replacing a mode line)",
      isEnabled: () => activeCodeCell() !== null,
      execute: insertLine('eager')
    });

    // Commands and palette; the mode entries once per mode.
    if (palette) {
      for (const mode of MODES) {
        palette.addItem({ command: CommandIDs.setDefaultMode, category: CATEGORY, args: { mode } });
      }
      for (const command of [
        CommandIDs.releaseMemory,
        CommandIDs.switchDevices,
        CommandIDs.insertGraphLine,
        CommandIDs.insertEagerLine
      ]) {
        palette.addItem({ command, category: CATEGORY });
      }
    }

    if (mainMenu) {
      const menu = new Menu({ commands });
      menu.id = 'jp-mainmenu-shardlab';
      menu.title.label = 'shardlab';
      const modes = new Menu({ commands });
      modes.title.label = 'Default Mode';
      for (const mode of MODES) {
        modes.addItem({ command: CommandIDs.setDefaultMode, args: { mode } });
      }
      menu.addItem({ type: 'submenu', submenu: modes });
      menu.addItem({ command: CommandIDs.insertGraphLine });
      menu.addItem({ command: CommandIDs.insertEagerLine });
      menu.addItem({ type: 'separator' });
      menu.addItem({ command: CommandIDs.releaseMemory });
      menu.addItem({ command: CommandIDs.switchDevices });
      // The other plugins' commands, now or when they are registered.
      const added = new Set<string>();
      const addLater = (id: string, index: number) => {
        if (!added.has(id) && commands.hasCommand(id)) {
          added.add(id);
          menu.insertItem(Math.min(index, menu.items.length), { command: id });
        }
      };
      const addOthers = () => {
        addLater(SET_CELL_MODE_COMMAND, 1);
        addLater(OPEN_PANEL_COMMAND, menu.items.length);
      };
      addOthers();
      commands.commandChanged.connect((_, change) => {
        if (change.type === 'added') {
          addOthers();
        }
      });
      mainMenu.addMenu(menu, true, { rank: 1000 });
    }

    // The notebook's state changes what is enabled: tell the menus.
    const followed = new WeakSet<ShardlabConnection>();
    const notify = () => commands.notifyCommandChanged();
    tracker.currentChanged.connect((_, panel) => {
      notify();
      const conn = panel ? connectionFor(panel.sessionContext) : null;
      if (conn && !followed.has(conn)) {
        followed.add(conn);
        conn.statusChanged.connect(notify);
      }
    });

    if (settings) {
      // Loaded here so that the schema is registered early; cellmode.ts and statusbar.ts
      // read their values from the same plugin id.
      void settings.load(SETTINGS_PLUGIN_ID).catch(() => undefined);
    }
  }
};

export default plugin;
