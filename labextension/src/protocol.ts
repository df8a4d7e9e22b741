/**
 * The kernel's side of the `shardlab` comm: the status record and the replies to requests,
 * their types and their validation. The record is defined by
 * labextension/protocol/status.schema.json (python/shardlab/kernel/status.py builds it);
 * validateStatus accepts what that schema accepts (labextension/test/status-schema.test.ts
 * checks they agree). No JupyterLab imports (unit-tested in node,
 * labextension/test/protocol.test.ts).
 */

import { isMode } from './modes';
import type { Mode } from './modes';

/** The kernel's comm target (python/shardlab/kernel/status.py). */
export const COMM_TARGET = 'shardlab';

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
  duration_s: number | null; // null when not finite (the kernel sends no NaN)
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

/** A target the kernel plans for (`target_info` in python/shardlab/kernel/status.py). */
export interface ITargetInfo {
  kind: string;
  label: string;
  count: number;
  description: string;
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
  /** The machine planned for (`%target`); absent from older kernels, null for own devices. */
  target?: ITargetInfo | null;
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

function isTargetInfo(value: unknown): value is ITargetInfo {
  return (
    isDict(value) &&
    typeof value.kind === 'string' &&
    typeof value.label === 'string' &&
    isCount(value.count) &&
    typeof value.description === 'string'
  );
}

function isHistoryItem(value: unknown): value is IHistoryItem {
  return (
    isDict(value) &&
    isCount(value.execution_count) &&
    isMode(value.mode) &&
    typeof value.source === 'string' &&
    (value.duration_s === null || isFiniteNumber(value.duration_s))
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
    (value.target === undefined || value.target === null || isTargetInfo(value.target)) &&
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
