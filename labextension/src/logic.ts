/**
 * Pure logic of the shardlab extension: the status record's types and validation, text
 * formatting, mode magic lines and cell badges. No JupyterLab imports, so it is unit-tested
 * in node (labextension/test/logic.test.ts) and shared by every plugin.
 */

/** The id of the plugin that owns the settings (labextension/schema/plugin.json). */
export const SETTINGS_PLUGIN_ID = 'shardlab:plugin';

/** The kernel's comm target (python/shardlab/kernel/status.py). */
export const COMM_TARGET = 'shardlab';

/** Commands of the other plugins, run by id when they are registered. */
export const OPEN_PANEL_COMMAND = 'shardlab:open-panel';
export const SET_CELL_MODE_COMMAND = 'shardlab:set-cell-mode';

export const MODES = ['eager', 'jit', 'graph'] as const;
export type Mode = (typeof MODES)[number];
export type ModeSource = 'magic' | 'metadata' | 'default';

/** A cell's mode setting for new cells: "default" leaves the metadata empty. */
export const CELL_MODE_SETTINGS = ['default', ...MODES] as const;
export type CellModeSetting = (typeof CELL_MODE_SETTINGS)[number];

export interface IDeviceInfo {
  platform: string | null;
  count: number;
  kinds: string[];
  pinned: string | null;
}

export interface IArrayInfo {
  name: string;
  shape: number[];
  dtype: string;
  sharding: string;
  bytes_per_device: number;
}

export interface IHistoryItem {
  execution_count: number;
  mode: Mode;
  source: string;
  duration_s: number;
}

export interface IMemoryMarker {
  t: number;
  kind: string;
  text: string;
}

/** `memory_history` of the status record. */
export interface IMemoryHistory {
  devices: string[];
  /** Seconds since the kernel started recording, one per sample. */
  t: number[];
  /** Per sample, bytes per device in `devices` order; null where the device was absent. */
  bytes: (number | null)[][];
  markers: IMemoryMarker[];
  /** How many samples the kernel holds (more than `t.length` when it sent fewer). */
  samples: number;
}

/** The kernel's status record (`status_record` in python/shardlab/kernel/status.py). */
export interface IShardlabStatus {
  version: number;
  default_mode: Mode;
  last_mode: Mode | null;
  last_mode_source: string | null;
  execution_count: number | null;
  last_duration_s: number | null;
  devices: IDeviceInfo;
  bytes_per_device: Record<string, number>;
  mesh: Record<string, number> | null;
  largest_arrays: IArrayInfo[];
  history: IHistoryItem[];
  /** Live bytes per device over time; absent from older kernels, null before recording. */
  memory_history?: IMemoryHistory | null;
}

export interface IReleaseResult {
  text: string;
  before: number;
  after: number;
}

export interface IDevicesResult {
  ok: boolean;
  text: string;
}

// -- validation -------------------------------------------------------------------------

type Dict = Record<string, unknown>;

function isDict(value: unknown): value is Dict {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function isCount(value: unknown): value is number {
  return typeof value === 'number' && Number.isInteger(value) && value >= 0;
}

function isFiniteNumber(value: unknown): value is number {
  return typeof value === 'number' && Number.isFinite(value);
}

function isStringOrNull(value: unknown): value is string | null {
  return value === null || typeof value === 'string';
}

export function isMode(value: unknown): value is Mode {
  return typeof value === 'string' && (MODES as readonly string[]).includes(value);
}

function isByteMap(value: unknown): value is Record<string, number> {
  return isDict(value) && Object.values(value).every(isCount);
}

function isArrayInfo(value: unknown): value is IArrayInfo {
  return (
    isDict(value) &&
    typeof value.name === 'string' &&
    Array.isArray(value.shape) &&
    value.shape.every(isCount) &&
    typeof value.dtype === 'string' &&
    typeof value.sharding === 'string' &&
    isCount(value.bytes_per_device)
  );
}

function isHistoryItem(value: unknown): value is IHistoryItem {
  return (
    isDict(value) &&
    isCount(value.execution_count) &&
    isMode(value.mode) &&
    typeof value.source === 'string' &&
    isFiniteNumber(value.duration_s)
  );
}

/** True for a well-formed `memory_history` (rows as long as `devices`, one per time). */
export function isMemoryHistory(value: unknown): value is IMemoryHistory {
  if (!isDict(value)) {
    return false;
  }
  const { devices, t, bytes, markers, samples } = value;
  return (
    Array.isArray(devices) &&
    devices.every(d => typeof d === 'string') &&
    Array.isArray(t) &&
    t.every(isFiniteNumber) &&
    Array.isArray(bytes) &&
    bytes.length === t.length &&
    bytes.every(
      row =>
        Array.isArray(row) &&
        row.length === devices.length &&
        row.every(b => b === null || (isFiniteNumber(b) && b >= 0))
    ) &&
    Array.isArray(markers) &&
    markers.every(
      m =>
        isDict(m) && isFiniteNumber(m.t) && typeof m.kind === 'string' && typeof m.text === 'string'
    ) &&
    isFiniteNumber(samples)
  );
}

/**
 * The status record if `value` is a well-formed one, else null. Fields added by newer
 * kernels are kept; missing or mistyped known fields reject the record (a malformed
 * `memory_history` only becomes null).
 */
export function validateStatus(value: unknown): IShardlabStatus | null {
  if (!isDict(value)) {
    return null;
  }
  const devices = value.devices;
  const ok =
    isCount(value.version) &&
    isMode(value.default_mode) &&
    (value.last_mode === null || isMode(value.last_mode)) &&
    isStringOrNull(value.last_mode_source) &&
    (value.execution_count === null || isCount(value.execution_count)) &&
    (value.last_duration_s === null || isFiniteNumber(value.last_duration_s)) &&
    isDict(devices) &&
    isStringOrNull(devices.platform) &&
    isCount(devices.count) &&
    Array.isArray(devices.kinds) &&
    devices.kinds.every(k => typeof k === 'string') &&
    isStringOrNull(devices.pinned) &&
    isByteMap(value.bytes_per_device) &&
    (value.mesh === null || isByteMap(value.mesh)) &&
    Array.isArray(value.largest_arrays) &&
    value.largest_arrays.every(isArrayInfo) &&
    Array.isArray(value.history) &&
    value.history.every(isHistoryItem);
  if (ok && value.memory_history !== undefined && !isMemoryHistory(value.memory_history)) {
    // a malformed chart costs the chart, not the panel
    return { ...(value as unknown as IShardlabStatus), memory_history: null };
  }
  return ok ? (value as unknown as IShardlabStatus) : null;
}

/** The record of a `{"type": "status", "status": record}` comm message, else null. */
export function parseStatusMessage(data: unknown): IShardlabStatus | null {
  if (!isDict(data) || data.type !== 'status') {
    return null;
  }
  return validateStatus(data.status);
}

/** The reply to a `release` request, else null. */
export function parseReleaseReply(data: unknown): IReleaseResult | null {
  if (
    isDict(data) &&
    data.type === 'release' &&
    typeof data.text === 'string' &&
    isCount(data.before) &&
    isCount(data.after)
  ) {
    return { text: data.text, before: data.before, after: data.after };
  }
  return null;
}

/** The reply to a `switch_devices` request, else null. */
export function parseDevicesReply(data: unknown): IDevicesResult | null {
  if (
    isDict(data) &&
    data.type === 'devices' &&
    typeof data.ok === 'boolean' &&
    typeof data.text === 'string'
  ) {
    return { ok: data.ok, text: data.text };
  }
  return null;
}

/** The message of an error reply (`{"type": "error", "message": ...}`), else null. */
export function errorMessage(data: unknown): string | null {
  if (isDict(data) && data.type === 'error') {
    return typeof data.message === 'string' ? data.message : 'shardlab: request failed';
  }
  return null;
}

// -- text -------------------------------------------------------------------------------

const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];

/** Bytes in binary units, as the kernel prints them: "512 B", "12.0 MiB". */
export function formatBytes(bytes: number): string {
  if (!Number.isFinite(bytes)) {
    return '? B';
  }
  let value = bytes;
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < UNITS.length - 1) {
    value /= 1024;
    unit++;
  }
  return unit === 0 ? `${Math.round(value)} B` : `${value.toFixed(1)} ${UNITS[unit]}`;
}

/** A duration for a badge: "850 µs", "12 ms", "1.2 s", "3 min 5 s". */
export function formatDuration(seconds: number): string {
  if (!Number.isFinite(seconds) || seconds < 0) {
    return '';
  }
  if (seconds < 1e-3) {
    return `${Math.round(seconds * 1e6)} µs`;
  }
  if (seconds < 1) {
    return `${Math.round(seconds * 1e3)} ms`;
  }
  if (seconds < 60) {
    return `${seconds.toFixed(seconds < 10 ? 1 : 0)} s`;
  }
  const minutes = Math.floor(seconds / 60);
  return `${minutes} min ${Math.round(seconds - minutes * 60)} s`;
}

/** The device set: "8 × CPU", "2 × NVIDIA H100 80GB HBM3", "4 × GPU (A100, H100)". */
export function deviceText(devices: IDeviceInfo): string {
  if (devices.count === 0) {
    return 'no devices';
  }
  const platform = (devices.platform ?? 'device').toUpperCase();
  if (platform === 'CPU') {
    return `${devices.count} × CPU`;
  }
  if (devices.kinds.length === 1) {
    return `${devices.count} × ${devices.kinds[0]}`;
  }
  const kinds = devices.kinds.length ? ` (${devices.kinds.join(', ')})` : '';
  return `${devices.count} × ${platform}${kinds}`;
}

/** "mesh data=2 model=4", or "" without a mesh. */
export function meshText(mesh: Record<string, number> | null): string {
  if (!mesh || Object.keys(mesh).length === 0) {
    return '';
  }
  return (
    'mesh ' +
    Object.entries(mesh)
      .map(([axis, size]) => `${axis}=${size}`)
      .join(' ')
  );
}

/** The most bytes any one device holds. */
export function maxBytesPerDevice(bytesPerDevice: Record<string, number>): number {
  return Object.values(bytesPerDevice).reduce((a, b) => Math.max(a, b), 0);
}

/** "12.0 MiB/device": the most live bytes on any one device. */
export function memoryText(bytesPerDevice: Record<string, number>): string {
  return `${formatBytes(maxBytesPerDevice(bytesPerDevice))}/device`;
}

/** The parts the status bar shows, in order. */
export function statusBarParts(status: IShardlabStatus): string[] {
  const parts = [status.default_mode, deviceText(status.devices)];
  const mesh = meshText(status.mesh);
  if (mesh) {
    parts.push(mesh);
  }
  parts.push(memoryText(status.bytes_per_device));
  return parts;
}

export function statusBarText(status: IShardlabStatus): string {
  return statusBarParts(status).join(' · ');
}

/** A longer text for the status bar's tooltip. */
export function statusTooltip(status: IShardlabStatus): string {
  const lines = [
    `shardlab · default mode ${status.default_mode}` +
      (status.last_mode ? `, last cell ${status.last_mode}` : ''),
    `devices: ${deviceText(status.devices)}` +
      (status.devices.pinned ? ` (pinned ${status.devices.pinned})` : ''),
    ...Object.entries(status.bytes_per_device).map(
      ([device, bytes]) => `  ${device}: ${formatBytes(bytes)}`
    )
  ];
  const mesh = meshText(status.mesh);
  if (mesh) {
    lines.push(mesh);
  }
  lines.push('click: open the shardlab panel');
  return lines.join('\n');
}

/** The mode after `mode` when cycling: eager → jit → graph → eager. */
export function nextMode(mode: Mode): Mode {
  return MODES[(MODES.indexOf(mode) + 1) % MODES.length];
}

// -- device specs -----------------------------------------------------------------------

export interface IDeviceSpec {
  platform: 'cpu' | 'gpu';
  spec: string;
  count: number | null;
}

/** Parses "cpu:N", "gpu:I,J" or "gpu:all" as the kernel does; null when malformed. */
export function parseDeviceSpec(text: string): IDeviceSpec | null {
  const match = /^(cpu|gpu):(all|\d+(?:,\d+)*)$/.exec(text.trim().toLowerCase());
  if (!match) {
    return null;
  }
  const [, platform, rest] = match;
  if (platform === 'cpu') {
    if (rest === 'all' || rest.includes(',')) {
      return null;
    }
    const count = Number(rest);
    return count >= 1 ? { platform: 'cpu', spec: `cpu:${count}`, count } : null;
  }
  return { platform: 'gpu', spec: `gpu:${rest}`, count: null };
}

/** The command that installs a kernelspec pinned to a GPU set. */
export function gpuInstallCommand(spec: string): string {
  const suffix = spec.replace(/^gpu:/, '').replace(/,/g, '') || 'all';
  return `python -m shardlab install --user --devices ${spec} --name shardlab-gpu${suffix}`;
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
