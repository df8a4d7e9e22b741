/**
 * The shardlab side panel (right sidebar) and the command `shardlab:open-panel`. The panel
 * follows the current notebook: it shows that notebook's kernel's devices, memory, largest
 * arrays and recent cells, or says the kernel is not shardlab's.
 */
import type { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ILayoutRestorer } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import type { NotebookPanel } from '@jupyterlab/notebook';
import { LabIcon } from '@jupyterlab/ui-components';

import { connectionFor } from './comm';
import { OPEN_PANEL_COMMAND } from './ids';
import { ShardlabPanel } from './panel-widget';

const PANEL_ID = 'shardlab-panel';

/** Eight devices in a 2 × 4 grid, one of them filled: the sidebar's icon. */
const SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 16 16">
<g class="jp-icon3" fill="#616161">
<rect x="1" y="3" width="2.5" height="4" rx="0.5"/><rect x="4.8" y="3" width="2.5" height="4" rx="0.5" fill-opacity="0.45"/>
<rect x="8.7" y="3" width="2.5" height="4" rx="0.5" fill-opacity="0.45"/><rect x="12.5" y="3" width="2.5" height="4" rx="0.5" fill-opacity="0.45"/>
<rect x="1" y="9" width="2.5" height="4" rx="0.5" fill-opacity="0.45"/><rect x="4.8" y="9" width="2.5" height="4" rx="0.5" fill-opacity="0.45"/>
<rect x="8.7" y="9" width="2.5" height="4" rx="0.5" fill-opacity="0.45"/><rect x="12.5" y="9" width="2.5" height="4" rx="0.5" fill-opacity="0.45"/>
</g></svg>`;

export const shardlabIcon = new LabIcon({ name: 'shardlab:devices', svgstr: SVG });

function activate(
  app: JupyterFrontEnd,
  tracker: INotebookTracker,
  palette: ICommandPalette | null,
  restorer: ILayoutRestorer | null
): void {
  const panel = new ShardlabPanel();
  panel.id = PANEL_ID;
  panel.title.icon = shardlabIcon;
  panel.title.caption = 'shardlab: devices, memory, arrays';
  app.shell.add(panel, 'right', { rank: 900 });
  restorer?.add(panel, PANEL_ID);

  let current: NotebookPanel | null = null;
  const follow = (): void => {
    const notebook = tracker.currentWidget;
    if (current !== notebook) {
      current?.sessionContext.kernelChanged.disconnect(follow);
      current = notebook;
      current?.sessionContext.kernelChanged.connect(follow);
    }
    if (notebook === null || notebook.isDisposed) {
      panel.setSource(null, '');
      return;
    }
    panel.setSource(connectionFor(notebook.sessionContext), notebook.title.label);
  };
  tracker.currentChanged.connect(follow);
  follow();

  app.commands.addCommand(OPEN_PANEL_COMMAND, {
    label: 'Open the shardlab Panel',
    caption: 'Devices, per-device memory, largest arrays and recent cells of the current notebook',
    icon: shardlabIcon,
    execute: () => {
      app.shell.activateById(PANEL_ID);
    }
  });
  palette?.addItem({ command: OPEN_PANEL_COMMAND, category: 'shardlab' });
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'shardlab:panel',
  description: 'The shardlab side panel: devices, memory, largest arrays, recent cells.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ICommandPalette, ILayoutRestorer],
  activate
};

export default plugin;
