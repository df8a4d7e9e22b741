/**
 * Cell modes: their names, the `%%mode` magic line of a cell's source, the mode in a cell's
 * metadata and in its execute reply, and the badge that says which mode a cell ran in. No
 * JupyterLab imports (unit-tested in node, labextension/test/modes.test.ts).
 */

import { formatDuration } from './units';

export const MODES = ['eager', 'jit', 'graph'] as const;
export type Mode = (typeof MODES)[number];
export type ModeSource = 'magic' | 'metadata' | 'default';

/** A cell's mode setting for new cells: "default" leaves the metadata empty. */
export const CELL_MODE_SETTINGS = ['default', ...MODES] as const;
export type CellModeSetting = (typeof CELL_MODE_SETTINGS)[number];

export function isMode(value: unknown): value is Mode {
  return typeof value === 'string' && (MODES as readonly string[]).includes(value);
}

/** The mode after `mode` when cycling: eager → jit → graph → eager. */
export function nextMode(mode: Mode): Mode {
  return MODES[(MODES.indexOf(mode) + 1) % MODES.length];
}

type Dict = Record<string, unknown>;

function isDict(value: unknown): value is Dict {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

// -- mode magic lines -------------------------------------------------------------------

/**
 * The mode a cell's first line sets (`%%eager`, `%%jit`, `%%graph`, `%%mode NAME`), after
 * leading blank lines as the kernel allows; null when it has none (or an unknown name).
 */
export function modeMagicOf(source: string): Mode | null {
  const first = source.replace(/^\n+/, '').split('\n', 1)[0].trim();
  if (!first.startsWith('%%')) {
    return null;
  }
  const words = first.slice(2).split(/\s+/);
  if (isMode(words[0])) {
    return words[0];
  }
  if (words[0] === 'mode' && isMode(words[1]?.toLowerCase())) {
    return words[1].toLowerCase() as Mode;
  }
  return null;
}

/** Whether the first line is a mode magic, known mode or not (`%%mode bogus` counts). */
function hasModeMagicLine(source: string): boolean {
  const first = source.replace(/^\n+/, '').split('\n', 1)[0].trim();
  const name = first.startsWith('%%') ? first.slice(2).split(/\s+/)[0] : '';
  return isMode(name) || name === 'mode';
}

/** The cell source with `%%mode` as its first line, replacing a mode magic line. */
export function setModeMagicLine(source: string, mode: Mode): string {
  const line = `%%${mode}`;
  if (hasModeMagicLine(source)) {
    const blank = source.length - source.replace(/^\n+/, '').length;
    const rest = source.slice(blank);
    const newline = rest.indexOf('\n');
    return line + (newline < 0 ? '' : rest.slice(newline));
  }
  return source ? `${line}\n${source}` : line;
}

/** The cell source without a mode magic first line. */
export function removeModeMagicLine(source: string): string {
  if (!hasModeMagicLine(source)) {
    return source;
  }
  const rest = source.replace(/^\n+/, '');
  const newline = rest.indexOf('\n');
  return newline < 0 ? '' : rest.slice(newline + 1);
}

// -- cell badges ------------------------------------------------------------------------

/** The mode in a cell's metadata (`{"shardlab": {"mode": ...}}`), else null. */
export function metadataMode(metadata: unknown): Mode | null {
  if (!isDict(metadata) || !isDict(metadata.shardlab)) {
    return null;
  }
  const mode = metadata.shardlab.mode;
  return isMode(mode) ? mode : null;
}

/** What the execute reply's metadata says about a cell's run (`shardlab.mode`...). */
export interface IReplyMode {
  mode: Mode | null;
  source: ModeSource | null;
  error: string | null;
}

export function replyMode(replyMetadata: unknown): IReplyMode {
  const entry = isDict(replyMetadata) ? replyMetadata.shardlab : undefined;
  if (!isDict(entry)) {
    return { mode: null, source: null, error: null };
  }
  const source = entry.mode_source;
  return {
    mode: isMode(entry.mode) ? entry.mode : null,
    source: source === 'magic' || source === 'metadata' || source === 'default' ? source : null,
    error: typeof entry.mode_error === 'string' ? entry.mode_error : null
  };
}

export interface IBadge {
  /** "graph · 12 ms", "graph" (not run yet), or "" (nothing to show). */
  text: string;
  /** The mode shown: the run's effective mode, else the metadata's. */
  mode: Mode | null;
  /** A `%%magic` first line overrode a different mode in the cell's metadata. */
  overridden: boolean;
  /** A tooltip: where the mode came from. */
  title: string;
}

/**
 * The badge of a cell: its metadata mode (or null), and what the last execute reply said
 * (mode and source, or nulls before a run) and how long the run took (or null).
 */
export function effectiveBadge(
  metadataModeValue: Mode | null,
  replyModeValue: Mode | null,
  replySource: string | null,
  durationS: number | null
): IBadge {
  if (replyModeValue === null) {
    if (metadataModeValue === null) {
      return { text: '', mode: null, overridden: false, title: '' };
    }
    return {
      text: metadataModeValue,
      mode: metadataModeValue,
      overridden: false,
      title: `runs as ${metadataModeValue} (cell metadata)`
    };
  }
  const duration = durationS === null ? '' : formatDuration(durationS);
  const text = duration ? `${replyModeValue} · ${duration}` : replyModeValue;
  const overridden =
    replySource === 'magic' && metadataModeValue !== null && metadataModeValue !== replyModeValue;
  const from =
    replySource === 'magic'
      ? 'the %%' + replyModeValue + ' line'
      : replySource === 'metadata'
        ? 'cell metadata'
        : replySource === 'default'
          ? 'the session default'
          : 'the kernel';
  const title = overridden
    ? `ran as ${replyModeValue}: the %%${replyModeValue} line overrides the cell's mode ${metadataModeValue}`
    : `ran as ${replyModeValue} (from ${from})`;
  return { text, mode: replyModeValue, overridden, title };
}
