/**
 * The shardlab JupyterLab extension: its plugins, one per feature.
 *
 * - `shardlab:plugin` (commands.ts): commands, the shardlab menu and palette, the settings
 * - `shardlab:statusbar` (statusbar.ts): mode, devices, mesh and memory of the kernel
 * - cellmode.ts: the per-cell mode control; panel.ts: the side panel
 *
 * comm.ts is the client of the kernel's `shardlab` comm that they all share. The pure
 * modules (no JupyterLab imports, unit-tested in labextension/test): protocol.ts (the status
 * record and replies, validated), format.ts (bytes, durations, devices and mesh as text),
 * modes.ts (mode names, magic lines, cell badges), ids.ts (shared plugin and command ids).
 */
import type { JupyterFrontEndPlugin } from '@jupyterlab/application';

import cellmode from './cellmode';
import commands from './commands';
import panel from './panel';
import statusbar from './statusbar';

export { ShardlabConnection, connectionFor } from './comm';
export * from './format';
export * from './ids';
export * from './modes';
export * from './protocol';

const plugins: JupyterFrontEndPlugin<any>[] = [commands, statusbar, cellmode, panel];

export default plugins;
