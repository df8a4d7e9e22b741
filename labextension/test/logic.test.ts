import { describe, expect, it } from 'vitest';

import {
  SETTINGS_PLUGIN_ID,
  deviceText,
  effectiveBadge,
  errorMessage,
  formatBytes,
  formatDuration,
  gpuInstallCommand,
  maxBytesPerDevice,
  memoryText,
  meshText,
  metadataMode,
  modeMagicOf,
  nextMode,
  parseDeviceSpec,
  parseDevicesReply,
  parseReleaseReply,
  parseStatusMessage,
  removeModeMagicLine,
  replyMode,
  setModeMagicLine,
  statusBarText,
  validateStatus
} from '../src/logic';
import type { IShardlabStatus } from '../src/logic';

/** A record as python/shardlab/kernel/status.py sends it. */
function record(overrides: Record<string, unknown> = {}): IShardlabStatus {
  return {
    version: 1,
    default_mode: 'jit',
    last_mode: 'graph',
    last_mode_source: 'magic',
    execution_count: 3,
    last_duration_s: 0.012,
    devices: { platform: 'cpu', count: 8, kinds: ['cpu'], pinned: 'cpu:8' },
    bytes_per_device: { TFRT_CPU_0: 12 * 2 ** 20, TFRT_CPU_1: 4096 },
    mesh: { data: 2, model: 4 },
    largest_arrays: [
      {
        name: 'params["w"]',
        shape: [512, 1024],
        dtype: 'float32',
        sharding: "P('data', None) on 2×4",
        bytes_per_device: 1048576
      }
    ],
    history: [{ execution_count: 3, mode: 'graph', source: 'magic', duration_s: 0.012 }],
    ...overrides
  } as IShardlabStatus;
}

describe('status messages', () => {
  it('accepts a well-formed status message', () => {
    const status = parseStatusMessage({ type: 'status', status: record() });
    expect(status?.devices.count).toBe(8);
    expect(status?.mesh).toEqual({ data: 2, model: 4 });
  });

  it('accepts nulls before the first cell and unknown extra fields', () => {
    const fresh = record({
      last_mode: null,
      last_mode_source: null,
      execution_count: null,
      last_duration_s: null,
      mesh: null,
      largest_arrays: [],
      history: [],
      future_field: { anything: true }
    });
    expect(validateStatus(fresh)).not.toBeNull();
  });

  it.each([
    ['not an object', 'status'],
    ['null', null],
    ['an array', [record()]],
    ['an unknown default mode', record({ default_mode: 'fast' })],
    ['an unknown last mode', record({ last_mode: 'turbo' })],
    ['a negative device count', record({ devices: { platform: 'cpu', count: -1, kinds: [], pinned: null } })],
    ['kinds that are not strings', record({ devices: { platform: 'cpu', count: 1, kinds: [1], pinned: null } })],
    ['no devices', record({ devices: undefined })],
    ['bytes as strings', record({ bytes_per_device: { TFRT_CPU_0: '12' } })],
    ['a mesh size that is not a count', record({ mesh: { data: 1.5 } })],
    ['an array row without a name', record({ largest_arrays: [{ shape: [1], dtype: 'f', sharding: '', bytes_per_device: 1 }] })],
    ['a history row with a bad mode', record({ history: [{ execution_count: 1, mode: 'x', source: 'magic', duration_s: 0 }] })],
    ['a missing history', record({ history: undefined })],
    ['a non-finite duration', record({ last_duration_s: Infinity })]
  ])('rejects a record with %s', (_, value) => {
    expect(validateStatus(value)).toBeNull();
  });

  it('rejects messages that are not status messages', () => {
    expect(parseStatusMessage({ type: 'release', status: record() })).toBeNull();
    expect(parseStatusMessage({ status: record() })).toBeNull();
    expect(parseStatusMessage({ type: 'status' })).toBeNull();
    expect(parseStatusMessage(undefined)).toBeNull();
  });

  it('parses replies and errors', () => {
    expect(parseReleaseReply({ type: 'release', text: 't', before: 10, after: 4, id: 'x' })).toEqual({
      text: 't',
      before: 10,
      after: 4
    });
    expect(parseReleaseReply({ type: 'release', text: 't', before: '10', after: 4 })).toBeNull();
    expect(parseDevicesReply({ type: 'devices', ok: false, text: 'no' })).toEqual({ ok: false, text: 'no' });
    expect(parseDevicesReply({ type: 'devices', ok: 'yes', text: 'no' })).toBeNull();
    expect(errorMessage({ type: 'error', request: 'x', message: 'unknown request' })).toBe('unknown request');
    expect(errorMessage({ type: 'status' })).toBeNull();
  });
});

describe('text', () => {
  it('formats bytes in binary units', () => {
    expect(formatBytes(0)).toBe('0 B');
    expect(formatBytes(512)).toBe('512 B');
    expect(formatBytes(1024)).toBe('1.0 KiB');
    expect(formatBytes(12 * 2 ** 20)).toBe('12.0 MiB');
    expect(formatBytes(1.5 * 2 ** 30)).toBe('1.5 GiB');
    expect(formatBytes(3 * 2 ** 40)).toBe('3.0 TiB');
    expect(formatBytes(NaN)).toBe('? B');
  });

  it('formats durations', () => {
    expect(formatDuration(0.0004)).toBe('400 µs');
    expect(formatDuration(0.012)).toBe('12 ms');
    expect(formatDuration(1.234)).toBe('1.2 s');
    expect(formatDuration(42)).toBe('42 s');
    expect(formatDuration(125)).toBe('2 min 5 s');
    expect(formatDuration(-1)).toBe('');
  });

  it('describes device sets', () => {
    expect(deviceText({ platform: 'cpu', count: 8, kinds: ['cpu'], pinned: 'cpu:8' })).toBe('8 × CPU');
    expect(deviceText({ platform: 'gpu', count: 2, kinds: ['NVIDIA H200'], pinned: 'gpu:0,1' })).toBe(
      '2 × NVIDIA H200'
    );
    expect(deviceText({ platform: 'gpu', count: 3, kinds: ['A100', 'H100'], pinned: null })).toBe(
      '3 × GPU (A100, H100)'
    );
    expect(deviceText({ platform: null, count: 0, kinds: [], pinned: null })).toBe('no devices');
  });

  it('describes the mesh and memory', () => {
    expect(meshText({ data: 2, model: 4 })).toBe('mesh data=2 model=4');
    expect(meshText(null)).toBe('');
    expect(maxBytesPerDevice({ a: 1, b: 7, c: 3 })).toBe(7);
    expect(maxBytesPerDevice({})).toBe(0);
    expect(memoryText({ a: 12 * 2 ** 20, b: 0 })).toBe('12.0 MiB/device');
  });

  it('puts the status bar text together', () => {
    expect(statusBarText(record())).toBe('jit · 8 × CPU · mesh data=2 model=4 · 12.0 MiB/device');
    expect(statusBarText(record({ mesh: null }))).toBe('jit · 8 × CPU · 12.0 MiB/device');
  });

  it('cycles modes', () => {
    expect(nextMode('eager')).toBe('jit');
    expect(nextMode('jit')).toBe('graph');
    expect(nextMode('graph')).toBe('eager');
  });

  it('exports the settings plugin id', () => {
    expect(SETTINGS_PLUGIN_ID).toBe('shardlab:plugin');
  });
});

describe('device specs', () => {
  it('parses what the kernel accepts', () => {
    expect(parseDeviceSpec(' CPU:4 ')).toEqual({ platform: 'cpu', spec: 'cpu:4', count: 4 });
    expect(parseDeviceSpec('gpu:0,1')).toEqual({ platform: 'gpu', spec: 'gpu:0,1', count: null });
    expect(parseDeviceSpec('gpu:all')?.spec).toBe('gpu:all');
  });

  it.each(['cpu', 'cpu:0', 'cpu:all', 'cpu:1,2', 'tpu:4', 'gpu:', '4', ''])('rejects %j', text => {
    expect(parseDeviceSpec(text)).toBeNull();
  });

  it('gives the kernelspec command for a GPU set', () => {
    expect(gpuInstallCommand('gpu:0,1')).toBe(
      'python -m shardlab install --user --devices gpu:0,1 --name shardlab-gpu01'
    );
    expect(gpuInstallCommand('gpu:all')).toContain('--devices gpu:all --name shardlab-gpuall');
  });
});

describe('mode magic lines', () => {
  it('reads the first line as the kernel does', () => {
    expect(modeMagicOf('%%graph\nx = 1')).toBe('graph');
    expect(modeMagicOf('\n\n%%eager\nx')).toBe('eager');
    expect(modeMagicOf('%%mode jit\nx')).toBe('jit');
    expect(modeMagicOf('%%time\nx')).toBeNull();
    expect(modeMagicOf('x = 1\n%%graph')).toBeNull();
    expect(modeMagicOf('%%mode nope')).toBeNull();
  });

  it('inserts or replaces the mode line', () => {
    expect(setModeMagicLine('x = 1', 'graph')).toBe('%%graph\nx = 1');
    expect(setModeMagicLine('', 'graph')).toBe('%%graph');
    expect(setModeMagicLine('%%eager\nx = 1', 'graph')).toBe('%%graph\nx = 1');
    expect(setModeMagicLine('%%mode jit\nx = 1', 'eager')).toBe('%%eager\nx = 1');
    expect(setModeMagicLine('%%mode bogus\nx', 'eager')).toBe('%%eager\nx');
    expect(setModeMagicLine('\n%%jit\nx', 'graph')).toBe('%%graph\nx');
    expect(setModeMagicLine('%%graph', 'eager')).toBe('%%eager');
    expect(setModeMagicLine('%%time\nx', 'graph')).toBe('%%graph\n%%time\nx');
  });

  it('removes the mode line', () => {
    expect(removeModeMagicLine('%%graph\nx = 1')).toBe('x = 1');
    expect(removeModeMagicLine('x = 1')).toBe('x = 1');
    expect(removeModeMagicLine('%%jit')).toBe('');
  });
});

describe('cell badges', () => {
  it('reads metadata and reply metadata', () => {
    expect(metadataMode({ shardlab: { mode: 'graph' } })).toBe('graph');
    expect(metadataMode({ shardlab: { mode: 'nope' } })).toBeNull();
    expect(metadataMode({ shardlab: 'graph' })).toBeNull();
    expect(metadataMode(undefined)).toBeNull();
    expect(replyMode({ shardlab: { mode: 'jit', mode_source: 'default', mode_error: null } })).toEqual({
      mode: 'jit',
      source: 'default',
      error: null
    });
    expect(replyMode({})).toEqual({ mode: null, source: null, error: null });
  });

  it('shows the effective mode and how long the run took', () => {
    const badge = effectiveBadge('graph', 'graph', 'metadata', 0.012);
    expect(badge.text).toBe('graph · 12 ms');
    expect(badge.overridden).toBe(false);
    expect(badge.mode).toBe('graph');
  });

  it('flags a %%magic line that overrode the metadata', () => {
    const badge = effectiveBadge('graph', 'eager', 'magic', 1.5);
    expect(badge.text).toBe('eager · 1.5 s');
    expect(badge.overridden).toBe(true);
    expect(badge.title).toContain('overrides');
    expect(effectiveBadge('eager', 'eager', 'magic', 0.001).overridden).toBe(false);
    expect(effectiveBadge(null, 'eager', 'magic', 0.001).overridden).toBe(false);
  });

  it('before a run shows the metadata mode, or nothing', () => {
    expect(effectiveBadge('jit', null, null, null)).toMatchObject({ text: 'jit', overridden: false });
    expect(effectiveBadge(null, null, null, null).text).toBe('');
    expect(effectiveBadge(null, 'jit', 'default', null).text).toBe('jit');
  });
});
