/**
 * Text for people: bytes in binary units, durations, the device set and its specs
 * (`cpu:4`, `gpu:0,1`), the mesh, and the status bar's text and tooltip built from them. No
 * JupyterLab imports (unit-tested in node, labextension/test/format.test.ts).
 */

import type { IDeviceInfo, IShardlabStatus, ITargetInfo } from './protocol';
import { formatBytes, formatDuration } from './units';

export { formatBytes, formatDuration };

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

/** `target 64 × H100 SXM` for a status with a target; empty without one. */
export function targetText(target: ITargetInfo | null | undefined): string {
  return target ? `target ${target.count} × ${target.label}` : '';
}

/** The most bytes any one device holds. */
export function maxBytesPerDevice(bytesPerDevice: Record<string, number>): number {
  return Object.values(bytesPerDevice).reduce((a, b) => Math.max(a, b), 0);
}

/** "12.0 MiB/device": the most live bytes on any one device. */
export function memoryText(bytesPerDevice: Record<string, number>): string {
  return `${formatBytes(maxBytesPerDevice(bytesPerDevice))}/device`;
}

// -- the status bar ---------------------------------------------------------------------

/** The parts the status bar shows, in order, each with the name its element is styled by. */
export function statusBarParts(status: IShardlabStatus): Array<[string, string]> {
  const parts: Array<[string, string]> = [
    ['mode', status.default_mode],
    ['devices', deviceText(status.devices)]
  ];
  const mesh = meshText(status.mesh);
  if (mesh) {
    parts.push(['mesh', mesh]);
  }
  const target = targetText(status.target);
  if (target) {
    parts.push(['target', target]);
  }
  parts.push(['memory', memoryText(status.bytes_per_device)]);
  return parts;
}

/** The status bar's text, as one line. */
export function statusBarText(status: IShardlabStatus): string {
  return statusBarParts(status)
    .map(([, text]) => text)
    .join(' · ');
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
  if (status.target) {
    lines.push(`planning for ${status.target.description} (%target)`);
  }
  lines.push('click: open the shardlab panel');
  return lines.join('\n');
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
