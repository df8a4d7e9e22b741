import { describe, expect, it } from 'vitest';

import {
  errorMessage,
  parseDevicesReply,
  parseReleaseReply,
  parseStatusMessage,
  validateStatus
} from '../src/protocol';
import { statusRecord } from './records';

describe('status messages', () => {
  it('accepts a well-formed status message', () => {
    const status = parseStatusMessage({ type: 'status', status: statusRecord() });
    expect(status?.devices.count).toBe(8);
    expect(status?.mesh).toEqual({ data: 2, model: 4 });
  });

  it('accepts nulls before the first cell and unknown extra fields', () => {
    const fresh = statusRecord({
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
    ['an array', [statusRecord()]],
    ['an unknown default mode', statusRecord({ default_mode: 'fast' })],
    ['an unknown last mode', statusRecord({ last_mode: 'turbo' })],
    ['a negative device count', statusRecord({ devices: { platform: 'cpu', count: -1, kinds: [], pinned: null } })],
    ['kinds that are not strings', statusRecord({ devices: { platform: 'cpu', count: 1, kinds: [1], pinned: null } })],
    ['no devices', statusRecord({ devices: undefined })],
    ['bytes as strings', statusRecord({ bytes_per_device: { TFRT_CPU_0: '12' } })],
    ['a mesh size that is not a count', statusRecord({ mesh: { data: 1.5 } })],
    ['an array row without a name', statusRecord({ largest_arrays: [{ shape: [1], dtype: 'f', sharding: '', bytes_per_device: 1 }] })],
    ['a history row with a bad mode', statusRecord({ history: [{ execution_count: 1, mode: 'x', source: 'magic', duration_s: 0 }] })],
    ['a missing history', statusRecord({ history: undefined })],
    ['a non-finite duration', statusRecord({ last_duration_s: Infinity })]
  ])('rejects a record with %s', (_, value) => {
    expect(validateStatus(value)).toBeNull();
  });

  it('rejects messages that are not status messages', () => {
    expect(parseStatusMessage({ type: 'release', status: statusRecord() })).toBeNull();
    expect(parseStatusMessage({ status: statusRecord() })).toBeNull();
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
