/**
 * Units for people: bytes in binary units and durations, as the kernel prints them. No
 * imports: the modes, the status text and the panel all build on it.
 */

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
export function formatDuration(seconds: number | null): string {
  if (seconds === null || !Number.isFinite(seconds) || seconds < 0) {
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
