/**
 * Ids that plugins share without importing each other: the plugin that bears the settings
 * and the commands one plugin runs by id when another has registered them.
 */

/** The id of the plugin that owns the settings (labextension/schema/plugin.json). */
export const SETTINGS_PLUGIN_ID = 'shardlab:plugin';

/** Commands of the other plugins, run by id when they are registered. */
export const OPEN_PANEL_COMMAND = 'shardlab:open-panel';
export const SET_CELL_MODE_COMMAND = 'shardlab:set-cell-mode';
