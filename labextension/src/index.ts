/**
 * The shardlab JupyterLab extension: its plugins, one per feature.
 *
 * - `shardlab:plugin` (commands.ts): commands, the shardlab menu and palette, the settings
 * - `shardlab:statusbar` (statusbar.ts): mode, devices, mesh and memory of the kernel
 * - cellmode.ts: the per-cell mode control; panel.ts: the side panel
 *
 * comm.ts is the client of the kernel's `shardlab` comm that they all share; logic.ts holds
 * the pure functions (unit-tested in labextension/test).
 */
import type { JupyterFrontEndPlugin } from '@jupyterlab/application';

import cellmode from './cellmode';
import commands from './commands';
import panel from './panel';
import statusbar from './statusbar';

export { ShardlabConnection, connectionFor } from './comm';
export * from './logic';

const plugins: JupyterFrontEndPlugin<any>[] = [commands, statusbar, cellmode, panel];

export default plugins;
