/**
 * The panel's "memory over time" chart as plain geometry: a line per device (live bytes
 * against seconds), markers at releases, mode switches and device switches, axis labels in
 * human units. No DOM (unit-tested in node); panel-widget.ts draws it as SVG.
 *
 * Lines are steps: a device's bytes hold until the next sample (the kernel samples at
 * each cell's start and end and twice a second while one runs), so a release is a drop, not
 * a slope. The kernel sends at most a few hundred samples (`memory_history` in the status record,
 * python/shardlab/engine/memory_history.py); the chart draws at most `maxPoints` per line
 * (a bucket keeps its lowest and highest value, so peaks and releases stay visible) and the
 * newest `maxMarkers` markers.
 */
import { formatBytes } from './format';
import type { IMemoryHistory } from './protocol';
import { naturalCompare } from './panel-view';

export interface IChartOptions {
  width: number;
  height: number;
  maxPoints: number;
  maxMarkers: number;
}

export const CHART_DEFAULTS: IChartOptions = {
  width: 280,
  height: 120,
  maxPoints: 160,
  maxMarkers: 20
};

/** Plot area inside the SVG: room for byte labels on the left, seconds below. */
export const MARGIN = { left: 52, right: 8, top: 8, bottom: 16 };

/** Device lines; the markers' colours are kept out of it. */
export const DEVICE_COLORS = [
  '#0072B2',
  '#E69F00',
  '#56B4E9',
  '#4E79A7',
  '#F28E2B',
  '#59A14F',
  '#B07AA1',
  '#EDC948',
  '#9C755F',
  '#FF9DA7'
];

export const MARKER_COLORS: Record<string, string> = {
  release: '#009E73',
  mode: '#CC79A7',
  devices: '#D55E00'
};

export const MARKER_NAMES: Record<string, string> = {
  release: 'release',
  mode: 'mode switch',
  devices: 'device switch'
};

export interface IChartLine {
  device: string;
  color: string;
  /** SVG polyline `points`, one per unbroken run (a device absent for a while breaks it). */
  segments: string[];
  /** The device's latest bytes, or null when it is absent now. */
  last: number | null;
  peak: number;
}

export interface IChartMarker {
  x: number;
  kind: string;
  color: string;
  /** "release (cell 4) at 12.5 s" */
  title: string;
}

export interface IChartTick {
  y: number;
  label: string;
}

export interface IMemoryChart {
  width: number;
  height: number;
  lines: IChartLine[];
  markers: IChartMarker[];
  yTicks: IChartTick[];
  /** Left and right ends of the time axis. */
  xLabels: [string, string];
  summary: string;
}

/** "0 s", "12.5 s", "45 s", "3 min 5 s". */
export function formatSeconds(seconds: number): string {
  if (!Number.isFinite(seconds) || seconds <= 0) {
    return '0 s';
  }
  if (seconds < 60) {
    return `${seconds.toFixed(seconds < 10 ? 1 : 0)} s`;
  }
  const minutes = Math.floor(seconds / 60);
  return `${minutes} min ${Math.round(seconds - minutes * 60)} s`;
}

const STEPS = [1, 2, 2.5, 5, 10];

/**
 * The top of the byte axis: the smallest 1, 2, 2.5 or 5 × 10^k of a binary unit (B, KiB,
 * MiB, …) at or above `max`, so its label reads "4.0 MiB", not "3.7 MiB".
 */
export function niceBytesMax(max: number): number {
  if (!(max > 0)) {
    return 1024;
  }
  let unit = 1;
  while (max >= unit * 1024 && unit < 1024 ** 5) {
    unit *= 1024;
  }
  const value = max / unit;
  const power = 10 ** Math.floor(Math.log10(value));
  const step = STEPS.find(s => s * power >= value * (1 - 1e-12)) ?? 10;
  return step * power * unit;
}

/**
 * At most `maxPoints` of `points` (time order kept): the first and last, and from each
 * bucket between them its lowest and highest value. A null (device absent) is kept as it
 * breaks the line.
 */
export function decimate(
  points: readonly [number, number | null][],
  maxPoints: number
): [number, number | null][] {
  if (points.length <= maxPoints || maxPoints < 4) {
    return maxPoints < 4 && points.length > maxPoints
      ? [points[0], points[points.length - 1]]
      : [...points];
  }
  const inner = points.slice(1, -1);
  const buckets = Math.floor((maxPoints - 2) / 2);
  const out: [number, number | null][] = [points[0]];
  for (let k = 0; k < buckets; k++) {
    const chunk = inner.slice(
      Math.floor((k * inner.length) / buckets),
      Math.floor(((k + 1) * inner.length) / buckets)
    );
    if (chunk.length === 0) {
      continue;
    }
    const gap = chunk.findIndex(p => p[1] === null);
    if (gap >= 0) {
      out.push(chunk[gap]);
      continue;
    }
    let low = 0;
    let high = 0;
    chunk.forEach((p, i) => {
      if ((p[1] as number) < (chunk[low][1] as number)) {
        low = i;
      }
      if ((p[1] as number) > (chunk[high][1] as number)) {
        high = i;
      }
    });
    for (const i of low === high ? [low] : [Math.min(low, high), Math.max(low, high)]) {
      out.push(chunk[i]);
    }
  }
  out.push(points[points.length - 1]);
  return out;
}

function fmt(value: number): string {
  return value.toFixed(1);
}

/** The chart of `history`, or null while it has no sample. */
export function memoryChart(
  history: IMemoryHistory,
  options: Partial<IChartOptions> = {}
): IMemoryChart | null {
  const { width, height, maxPoints, maxMarkers } = { ...CHART_DEFAULTS, ...options };
  const count = history.t.length;
  if (count === 0 || history.devices.length === 0) {
    return null;
  }
  const t0 = history.t[0];
  const t1 = Math.max(history.t[count - 1], t0 + 1e-9);
  let most = 0;
  for (const row of history.bytes) {
    for (const b of row) {
      most = Math.max(most, b ?? 0);
    }
  }
  const top = niceBytesMax(most);
  const plotW = width - MARGIN.left - MARGIN.right;
  const plotH = height - MARGIN.top - MARGIN.bottom;
  const x = (t: number): number => MARGIN.left + ((t - t0) / (t1 - t0)) * plotW;
  const y = (b: number): number => MARGIN.top + plotH - (b / top) * plotH;

  const order = history.devices
    .map((device, index) => ({ device, index }))
    .sort((a, b) => naturalCompare(a.device, b.device));
  const lines = order.map(({ device, index }, k) => {
    // Drawn as steps (bytes hold until the next sample): half the points before, so a
    // line has at most maxPoints corners.
    const points = decimate(
      history.t.map((t, i) => [t, history.bytes[i][index]] as [number, number | null]),
      Math.max(Math.floor(maxPoints / 2), 2)
    );
    const segments: string[] = [];
    let run: string[] = [];
    let held: number | null = null;
    for (const [t, b] of points) {
      if (b === null) {
        if (run.length) {
          run.push(`${fmt(x(t))},${fmt(y(held as number))}`);
          segments.push(run.join(' '));
        }
        run = [];
      } else {
        if (run.length && held !== b) {
          run.push(`${fmt(x(t))},${fmt(y(held as number))}`);
        }
        run.push(`${fmt(x(t))},${fmt(y(b))}`);
      }
      held = b;
    }
    if (run.length) {
      segments.push(run.join(' '));
    }
    const values = history.bytes.map(row => row[index]);
    return {
      device,
      color: DEVICE_COLORS[k % DEVICE_COLORS.length],
      segments,
      last: values[values.length - 1],
      peak: values.reduce<number>((m, b) => Math.max(m, b ?? 0), 0)
    };
  });

  const markers = history.markers
    .filter(m => m.t >= t0 - 1e-9 && m.t <= t1 + 1e-9)
    .slice(-maxMarkers)
    .map(m => ({
      x: x(Math.min(Math.max(m.t, t0), t1)),
      kind: m.kind,
      color: MARKER_COLORS[m.kind] ?? '#888888',
      title: `${m.text} at ${formatSeconds(m.t - t0)}`
    }));

  const peakLine = lines.reduce((a, b) => (b.peak > a.peak ? b : a), lines[0]);
  const parts = [
    `${lines.length} device${lines.length === 1 ? '' : 's'} over ${formatSeconds(t1 - t0)}`,
    `peak ${formatBytes(peakLine.peak)}${lines.length > 1 ? ` (${peakLine.device})` : ''}`
  ];
  if (history.samples > count) {
    parts.push(`${count} of ${history.samples} samples`);
  }
  return {
    width,
    height,
    lines,
    markers,
    yTicks: [
      { y: y(top), label: formatBytes(top) },
      { y: y(top / 2), label: formatBytes(top / 2) },
      { y: y(0), label: '0' }
    ],
    xLabels: [formatSeconds(0), formatSeconds(t1 - t0)],
    summary: parts.join(' · ')
  };
}
