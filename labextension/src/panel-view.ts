/**
 * What the shardlab panel shows, as plain rows computed from the status record: no DOM,
 * no JupyterLab imports (unit-tested in node). panel.ts turns the rows into elements.
 */
import { deviceText, formatBytes, formatDuration, meshText } from './format';
import type { IArrayInfo, IHistoryItem, IReleaseResult, IShardlabStatus } from './protocol';

export interface IMemoryRow {
  device: string;
  bytes: number;
  text: string;
  /** Share of the fullest device's bytes, 0..1 (bars are drawn relative to it). */
  fraction: number;
}

export interface IArrayRow {
  name: string;
  /** "float32[1024, 256]" */
  type: string;
  sharding: string;
  perDevice: string;
}

export interface IHistoryRow {
  count: string;
  mode: string;
  duration: string;
  source: string;
}

/** Orders "TFRT_CPU_10" after "TFRT_CPU_9" (numbers compared as numbers). */
export function naturalCompare(a: string, b: string): number {
  return a.localeCompare(b, undefined, { numeric: true, sensitivity: 'base' });
}

/**
 * One row per device, bars relative to `scale` (the panel passes the peak it has seen, so
 * bars shrink after a release) or to the fullest device when that holds more.
 */
export function memoryRows(bytesPerDevice: Record<string, number>, scale = 0): IMemoryRow[] {
  const entries = Object.entries(bytesPerDevice).sort(([a], [b]) => naturalCompare(a, b));
  const most = entries.reduce((m, [, bytes]) => Math.max(m, bytes), scale);
  return entries.map(([device, bytes]) => ({
    device,
    bytes,
    text: formatBytes(bytes),
    fraction: most > 0 ? bytes / most : 0
  }));
}

/** "8 devices hold 2.0 GiB in all; the fullest 256.0 MiB". */
export function memorySummary(bytesPerDevice: Record<string, number>): string {
  const values = Object.values(bytesPerDevice);
  if (values.length === 0) {
    return 'no devices';
  }
  const total = values.reduce((a, b) => a + b, 0);
  const most = values.reduce((a, b) => Math.max(a, b), 0);
  if (total === 0) {
    return 'no live arrays';
  }
  return `total ${formatBytes(total)} · fullest ${formatBytes(most)}`;
}

export function arrayRows(arrays: readonly IArrayInfo[], limit = 10): IArrayRow[] {
  return [...arrays]
    .sort((a, b) => b.bytes_per_device - a.bytes_per_device)
    .slice(0, limit)
    .map(a => ({
      name: a.name,
      type: `${a.dtype}[${a.shape.join(', ')}]`,
      sharding: a.sharding,
      perDevice: formatBytes(a.bytes_per_device)
    }));
}

const SOURCES: Record<string, string> = {
  magic: '%% line',
  metadata: 'cell metadata',
  default: 'default'
};

/** The last cells, newest first. */
export function historyRows(history: readonly IHistoryItem[], limit = 8): IHistoryRow[] {
  return [...history]
    .slice(-limit)
    .reverse()
    .map(h => ({
      count: `[${h.execution_count}]`,
      mode: h.mode,
      duration: formatDuration(h.duration_s),
      source: SOURCES[h.source] ?? h.source
    }));
}

/** "8 × CPU · mesh data=2 model=4". */
export function devicesLine(status: IShardlabStatus): string {
  const mesh = meshText(status.mesh);
  const line = mesh ? `${deviceText(status.devices)} · ${mesh}` : deviceText(status.devices);
  return status.target ? `${line} · planning for ${status.target.description}` : line;
}

/** The device set the kernel was started with (its launcher's --devices). */
export function pinnedLine(status: IShardlabStatus): string {
  const pinned = status.devices.pinned;
  return pinned
    ? `pinned: ${pinned}`
    : 'not pinned: the kernel sees every device of its platform';
}

/** "Released 256.0 MiB: 257.0 MiB → 1.0 MiB". */
export function releaseLine(result: IReleaseResult): string {
  const freed = Math.max(result.before - result.after, 0);
  return `Released ${formatBytes(freed)}: ${formatBytes(result.before)} → ${formatBytes(result.after)}`;
}

/** The CPU count typed into the switch form, or an error to show next to it. */
export function cpuCount(text: string, limit = 4096): { count: number } | { error: string } {
  const trimmed = text.trim();
  if (!/^\d+$/.test(trimmed)) {
    return { error: `"${trimmed}" is not a whole number of devices` };
  }
  const count = Number(trimmed);
  if (count < 1 || count > limit) {
    return { error: `the number of CPU devices must be between 1 and ${limit}` };
  }
  return { count };
}

/** The text of a failed request, for the panel. */
export function errorMessageOf(error: unknown): string {
  if (error instanceof Error) {
    return error.message;
  }
  return typeof error === 'string' ? error : 'the request failed';
}
