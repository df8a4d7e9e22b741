import { describe, expect, it } from 'vitest';

import {
  deviceText,
  formatBytes,
  formatDuration,
  gpuInstallCommand,
  maxBytesPerDevice,
  memoryText,
  meshText,
  parseDeviceSpec,
  statusBarText,
  targetText
} from '../src/format';
import { statusRecord } from './records';

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
    expect(statusBarText(statusRecord())).toBe('jit · 8 × CPU · mesh data=2 model=4 · 12.0 MiB/device');
    expect(statusBarText(statusRecord({ mesh: null }))).toBe('jit · 8 × CPU · 12.0 MiB/device');
    const target = { kind: 'h100', label: 'H100 SXM', count: 64, description: '64 × H100 SXM (8 hosts × 8)' };
    expect(statusBarText(statusRecord({ target }))).toBe(
      'jit · 8 × CPU · mesh data=2 model=4 · target 64 × H100 SXM · 12.0 MiB/device'
    );
    expect(targetText(null)).toBe('');
    expect(targetText(undefined)).toBe('');
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
