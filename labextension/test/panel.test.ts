import { describe, expect, it } from 'vitest';

import type { IShardlabStatus } from '../src/protocol';
import {
  arrayRows,
  cpuCount,
  devicesLine,
  historyRows,
  memoryRows,
  memorySummary,
  naturalCompare,
  pinnedLine,
  releaseLine
} from '../src/panel-view';

const MiB = 1024 * 1024;

function status(overrides: Partial<IShardlabStatus> = {}): IShardlabStatus {
  return {
    version: 1,
    default_mode: 'jit',
    last_mode: 'graph',
    last_mode_source: 'magic',
    execution_count: 4,
    last_duration_s: 0.012,
    devices: { platform: 'cpu', count: 8, kinds: ['cpu'], pinned: 'cpu:8' },
    bytes_per_device: {},
    mesh: null,
    largest_arrays: [],
    history: [],
    ...overrides
  };
}

describe('memory rows', () => {
  it('orders devices naturally and scales bars to the fullest device', () => {
    const rows = memoryRows({ TFRT_CPU_10: 0, TFRT_CPU_2: 32 * MiB, TFRT_CPU_1: 64 * MiB });
    expect(rows.map(r => r.device)).toEqual(['TFRT_CPU_1', 'TFRT_CPU_2', 'TFRT_CPU_10']);
    expect(rows.map(r => r.fraction)).toEqual([1, 0.5, 0]);
    expect(rows[0].text).toBe('64.0 MiB');
    expect(naturalCompare('cpu:9', 'cpu:10')).toBeLessThan(0);
  });

  it('summarises in human units', () => {
    expect(memorySummary({})).toBe('no devices');
    expect(memorySummary({ a: 0, b: 0 })).toBe('no live arrays');
    expect(memorySummary({ a: 256 * MiB, b: 256 * MiB })).toBe('total 512.0 MiB · fullest 256.0 MiB');
    expect(memoryRows({ a: 0 })[0].fraction).toBe(0);
    // Bars relative to a peak the panel has seen: they shrink after a release.
    expect(memoryRows({ a: MiB }, 256 * MiB)[0].fraction).toBeCloseTo(1 / 256);
    expect(memoryRows({ a: 512 * MiB }, 256 * MiB)[0].fraction).toBe(1);
  });
});

describe('arrays and history', () => {
  it('lists the largest arrays under their names', () => {
    const rows = arrayRows(
      [
        { name: 'small', shape: [4], dtype: 'float32', sharding: 'replicated', bytes_per_device: 16 },
        { name: "params['w']", shape: [8192, 8192], dtype: 'float32', sharding: "P('data', None)", bytes_per_device: 32 * MiB }
      ],
      1
    );
    expect(rows).toEqual([
      { name: "params['w']", type: 'float32[8192, 8192]', sharding: "P('data', None)", perDevice: '32.0 MiB' }
    ]);
  });

  it('shows the last cells newest first', () => {
    const rows = historyRows(
      [
        { execution_count: 1, mode: 'jit', source: 'default', duration_s: 1.5 },
        { execution_count: 2, mode: 'graph', source: 'magic', duration_s: 0.012 }
      ],
      5
    );
    expect(rows).toEqual([
      { count: '[2]', mode: 'graph', duration: '12 ms', source: '%% line' },
      { count: '[1]', mode: 'jit', duration: '1.5 s', source: 'default' }
    ]);
  });
});

describe('devices', () => {
  it('says the device set, the mesh and the pin', () => {
    expect(devicesLine(status())).toBe('8 × CPU');
    expect(devicesLine(status({ mesh: { data: 2, model: 4 } }))).toBe('8 × CPU · mesh data=2 model=4');
    const target = { kind: 'tpu-v5e', label: 'TPU v5e', count: 256, description: '256 × TPU v5e (slice 16x16)' };
    expect(devicesLine(status({ mesh: { data: 16, model: 16 }, target }))).toBe(
      '8 × CPU · mesh data=16 model=16 · planning for 256 × TPU v5e (slice 16x16)'
    );
    expect(pinnedLine(status())).toBe('pinned: cpu:8');
    expect(pinnedLine(status({ devices: { platform: 'gpu', count: 2, kinds: ['H100'], pinned: null } }))).toMatch(/^not pinned/);
  });

  it('checks the CPU count typed into the form', () => {
    expect(cpuCount(' 4 ')).toEqual({ count: 4 });
    expect(cpuCount('0')).toHaveProperty('error');
    expect(cpuCount('4.5')).toHaveProperty('error');
    expect(cpuCount('99999')).toHaveProperty('error');
  });

  it('shows released bytes in human units', () => {
    expect(releaseLine({ text: '', before: 257 * MiB, after: MiB })).toBe('Released 256.0 MiB: 257.0 MiB → 1.0 MiB');
  });
});
