// Status records for the tests, as python/shardlab/kernel/status.py sends them.
import type { IMemoryHistory, IShardlabStatus } from '../src/protocol';

/** A record after a few cells (no `memory_history`, as older kernels send it). */
export function statusRecord(overrides: Record<string, unknown> = {}): IShardlabStatus {
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
    target: null,
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

/** A `memory_history` of two devices, one absent from the first sample. */
export function memoryHistory(overrides: Record<string, unknown> = {}): IMemoryHistory {
  return {
    devices: ['TFRT_CPU_0', 'TFRT_CPU_1'],
    t: [0, 0.5, 1.25],
    bytes: [
      [0, null],
      [4096, 4096],
      [12 * 2 ** 20, 4096]
    ],
    markers: [{ t: 1.2, kind: 'release', text: 'release (cell 3)' }],
    samples: 3,
    ...overrides
  } as IMemoryHistory;
}
