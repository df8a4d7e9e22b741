import { describe, expect, it } from 'vitest';

import { validateStatus } from '../src/protocol';
import type { IMemoryHistory } from '../src/protocol';
import {
  MARGIN,
  decimate,
  formatSeconds,
  memoryChart,
  niceBytesMax
} from '../src/memory-chart';

const KiB = 1024;
const MiB = 1024 * 1024;

function history(overrides: Partial<IMemoryHistory> = {}): IMemoryHistory {
  return {
    devices: ['TFRT_CPU_1', 'TFRT_CPU_0'],
    t: [0, 1, 2, 3],
    bytes: [
      [0, 0],
      [MiB, 2 * MiB],
      [MiB, 3 * MiB],
      [0, 0]
    ],
    markers: [{ t: 2.5, kind: 'release', text: 'release (cell 4)' }],
    samples: 4,
    ...overrides
  };
}

function ys(points: string): number[] {
  return points.split(' ').map(p => Number(p.split(',')[1]));
}

function xs(points: string): number[] {
  return points.split(' ').map(p => Number(p.split(',')[0]));
}

describe('scaling', () => {
  it('rounds the byte axis up to 1, 2, 2.5 or 5 of a binary unit', () => {
    expect(niceBytesMax(3 * MiB)).toBe(5 * MiB);
    expect(niceBytesMax(2 * MiB)).toBe(2 * MiB);
    expect(niceBytesMax(700 * KiB)).toBe(1000 * KiB);
    expect(niceBytesMax(1.1 * 1024 * MiB)).toBe(2 * 1024 * MiB);
    expect(niceBytesMax(0)).toBe(1024);
  });

  it('puts the peak under the top tick and zero on the bottom, in human units', () => {
    const chart = memoryChart(history(), { width: 300, height: 120 })!;
    expect(chart.yTicks.map(t => t.label)).toEqual(['5.0 MiB', '2.5 MiB', '0']);
    const bottom = 120 - MARGIN.bottom;
    const cpu0 = chart.lines.find(l => l.device === 'TFRT_CPU_0')!;
    const y = ys(cpu0.segments[0]);
    expect(y[0]).toBeCloseTo(bottom);
    const plotH = 120 - MARGIN.top - MARGIN.bottom;
    expect(Math.min(...y)).toBeCloseTo(bottom - (3 / 5) * plotH);
    const x = xs(cpu0.segments[0]);
    expect(x[0]).toBeCloseTo(MARGIN.left);
    expect(x[x.length - 1]).toBeCloseTo(300 - MARGIN.right);
    // steps: 2 MiB holds from t=1 until t=2, then 3 MiB; the release at t=3 is a drop
    const at = (t: number) => MARGIN.left + (t / 3) * (300 - MARGIN.left - MARGIN.right);
    const corners = cpu0.segments[0].split(' ').map(p => p.split(',').map(Number));
    const y2 = bottom - (2 / 5) * plotH;
    const y3 = bottom - (3 / 5) * plotH;
    expect(corners.map(([cx, cy]) => [Math.round(cx), Math.round(cy)])).toEqual(
      [
        [at(0), bottom],
        [at(1), bottom],
        [at(1), y2],
        [at(2), y2],
        [at(2), y3],
        [at(3), y3],
        [at(3), bottom]
      ].map(([cx, cy]) => [Math.round(cx), Math.round(cy)])
    );
    expect(chart.xLabels).toEqual(['0 s', '3.0 s']);
  });

  it('has one line per device in natural order, each with its peak and latest bytes', () => {
    const devices = Array.from({ length: 10 }, (_, d) => `TFRT_CPU_${9 - d}`);
    const chart = memoryChart(
      history({ devices, t: [0, 1], bytes: [devices.map(() => 0), devices.map((_, d) => d)] })
    )!;
    expect(chart.lines.map(l => l.device)).toEqual(
      Array.from({ length: 10 }, (_, d) => `TFRT_CPU_${d}`)
    );
    expect(new Set(chart.lines.map(l => l.color)).size).toBe(10);
    const two = memoryChart(history())!;
    expect(two.lines[0]).toMatchObject({ device: 'TFRT_CPU_0', peak: 3 * MiB, last: 0 });
    expect(two.summary).toBe('2 devices over 3.0 s · peak 3.0 MiB (TFRT_CPU_0)');
  });

  it('is null without samples and says when the kernel sent fewer than it holds', () => {
    expect(memoryChart(history({ t: [], bytes: [] }))).toBeNull();
    expect(memoryChart(history({ samples: 900 }))!.summary).toContain('4 of 900 samples');
    expect(formatSeconds(125)).toBe('2 min 5 s');
  });
});

describe('capping', () => {
  it('keeps at most maxPoints, the ends, and each bucket’s lowest and highest', () => {
    const points: [number, number | null][] = Array.from({ length: 1000 }, (_, i) => [
      i,
      i === 500 ? 10_000 : i === 700 ? 1 : 100
    ]);
    const kept = decimate(points, 50);
    expect(kept.length).toBeLessThanOrEqual(50);
    expect(kept[0]).toEqual([0, 100]);
    expect(kept[kept.length - 1]).toEqual([999, 100]);
    expect(kept.map(p => p[1])).toContain(10_000);
    expect(kept.map(p => p[1])).toContain(1);
    const times = kept.map(p => p[0]);
    expect(times).toEqual([...times].sort((a, b) => a - b));
    expect(decimate(points.slice(0, 10), 50)).toHaveLength(10);
  });

  it('caps every line of the chart and breaks a line where its device was absent', () => {
    const n = 1000;
    const t = Array.from({ length: n }, (_, i) => i / 10);
    const bytes = t.map((_, i) => [i >= 400 && i < 600 ? null : MiB, MiB]);
    const chart = memoryChart(history({ t, bytes, samples: n }), { maxPoints: 80 })!;
    for (const line of chart.lines) {
      const count = line.segments.reduce((c, s) => c + s.split(' ').length, 0);
      expect(count).toBeLessThanOrEqual(80);
    }
    const gappy = chart.lines.find(l => l.device === 'TFRT_CPU_1')!;
    expect(gappy.segments).toHaveLength(2);
  });
});

describe('markers', () => {
  it('sits at its time, coloured and titled by kind; only the newest are drawn', () => {
    const chart = memoryChart(history(), { width: 300 })!;
    const plotW = 300 - MARGIN.left - MARGIN.right;
    expect(chart.markers).toHaveLength(1);
    expect(chart.markers[0].x).toBeCloseTo(MARGIN.left + (2.5 / 3) * plotW);
    expect(chart.markers[0]).toMatchObject({ kind: 'release', color: '#009E73' });
    expect(chart.markers[0].title).toBe('release (cell 4) at 2.5 s');
    const many = Array.from({ length: 30 }, (_, i) => ({
      t: i / 10,
      kind: i % 2 ? 'mode' : 'devices',
      text: `m${i}`
    }));
    const capped = memoryChart(history({ markers: many }), { maxMarkers: 5 })!;
    expect(capped.markers.map(m => m.title.split(' ')[0])).toEqual([
      'm25',
      'm26',
      'm27',
      'm28',
      'm29'
    ]);
    // markers older than the first sample sent are not drawn at the edge
    const late = memoryChart(
      history({
        t: [1, 2, 3],
        bytes: [
          [0, 0],
          [0, 0],
          [0, 0]
        ],
        markers: [
          { t: 0.5, kind: 'devices', text: 'devices 8 → 2' },
          { t: 2.5, kind: 'release', text: 'release (cell 4)' }
        ]
      })
    )!;
    expect(late.markers.map(m => m.kind)).toEqual(['release']);
  });
});

describe('validation', () => {
  const record = {
    version: 1,
    default_mode: 'jit',
    last_mode: null,
    last_mode_source: null,
    execution_count: null,
    last_duration_s: null,
    devices: { platform: 'cpu', count: 2, kinds: ['cpu'], pinned: null },
    bytes_per_device: { TFRT_CPU_0: 0 },
    mesh: null,
    largest_arrays: [],
    history: []
  };

  it('keeps a well-formed history, accepts none, and drops only a malformed one', () => {
    expect(validateStatus({ ...record, memory_history: history() })?.memory_history).toEqual(
      history()
    );
    expect(validateStatus(record)).not.toBeNull();
    expect(validateStatus({ ...record, memory_history: null })?.memory_history).toBeNull();
    const bad = { ...history(), bytes: [[1]] };
    const status = validateStatus({ ...record, memory_history: bad });
    expect(status).not.toBeNull();
    expect(status?.memory_history).toBeNull();
  });
});
