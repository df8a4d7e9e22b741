// validateStatus (src/protocol.ts) agrees with the one definition of the status record,
// labextension/protocol/status.schema.json (the kernel's records are checked against it by
// tests/kernel/test_status_schema.py). Ajv comes with @jupyterlab/settingregistry.
import { Ajv2020 } from 'ajv/dist/2020';
import { describe, expect, it } from 'vitest';

import { validateStatus } from '../src/protocol';
import schema from '../protocol/status.schema.json';
import { memoryHistory, statusRecord } from './records';

const schemaAccepts = new Ajv2020({ allErrors: true, strictTypes: false }).compile(schema);

type Dict = Record<string, unknown>;

/** Whether the schema and the validator accept `value`, side by side. */
function verdicts(value: unknown): { schema: boolean; validator: boolean } {
  return { schema: schemaAccepts(value), validator: validateStatus(value) !== null };
}

function both(accepted: boolean): { schema: boolean; validator: boolean } {
  return { schema: accepted, validator: accepted };
}

function clone<T>(value: T): T {
  return JSON.parse(JSON.stringify(value)) as T;
}

const fresh = statusRecord({
  last_mode: null,
  last_mode_source: null,
  execution_count: null,
  last_duration_s: null,
  devices: { platform: null, count: 0, kinds: [], pinned: null },
  bytes_per_device: {},
  mesh: null,
  largest_arrays: [],
  history: [],
  memory_history: null
});

/** Objects of the record whose fields the schema lists, with the schema that lists them. */
const OBJECTS: [string, (record: Dict) => Dict, { properties: Dict; required: string[] }][] = [
  ['the record', r => r, schema],
  ['devices', r => r.devices as Dict, schema.properties.devices],
  ['an array row', r => (r.largest_arrays as Dict[])[0], schema.properties.largest_arrays.items],
  ['a history row', r => (r.history as Dict[])[0], schema.properties.history.items]
];

describe('the status schema and validateStatus', () => {
  it.each([
    ['a record after a few cells', statusRecord()],
    ['a record before any cell', fresh],
    ['a record with memory over time', statusRecord({ memory_history: memoryHistory() })],
    ['a record from a newer kernel', statusRecord({ future_field: { anything: true } })],
    [
      'a record planning for a target',
      statusRecord({ target: { kind: 'h100', label: 'H100 SXM', count: 64, description: '64 × H100 SXM (8 hosts × 8)' } })
    ],
    ['a history row whose duration was not finite', statusRecord({ history: [{ execution_count: 1, mode: 'jit', source: 'magic', duration_s: null }] })]
  ])('both accept %s, unchanged', (_, record) => {
    expect(verdicts(record)).toEqual(both(true));
    expect(validateStatus(record)).toEqual(record);
  });

  it.each([
    ['not an object', 'status'],
    ['null', null],
    ['an array', [statusRecord()]],
    ['version as a string', statusRecord({ version: '1' })],
    ['a fractional version', statusRecord({ version: 1.5 })],
    ['an unknown default mode', statusRecord({ default_mode: 'fast' })],
    ['an unknown last mode', statusRecord({ last_mode: 'turbo' })],
    ['a numeric last mode source', statusRecord({ last_mode_source: 3 })],
    ['a negative execution count', statusRecord({ execution_count: -1 })],
    ['a duration as a string', statusRecord({ last_duration_s: '12 ms' })],
    ['a negative device count', statusRecord({ devices: { platform: 'cpu', count: -1, kinds: [], pinned: null } })],
    ['kinds that are not strings', statusRecord({ devices: { platform: 'cpu', count: 1, kinds: [1], pinned: null } })],
    ['a numeric pin', statusRecord({ devices: { platform: 'cpu', count: 1, kinds: [], pinned: 8 } })],
    ['bytes as strings', statusRecord({ bytes_per_device: { TFRT_CPU_0: '12' } })],
    ['negative bytes', statusRecord({ bytes_per_device: { TFRT_CPU_0: -1 } })],
    ['a mesh size that is not a count', statusRecord({ mesh: { data: 1.5 } })],
    ['a mesh as a list', statusRecord({ mesh: [2, 4] })],
    ['arrays as an object', statusRecord({ largest_arrays: {} })],
    ['an array shape with a float', statusRecord({ largest_arrays: [{ name: 'x', shape: [1.5], dtype: 'f', sharding: '', bytes_per_device: 1 }] })],
    ['a history row with a bad mode', statusRecord({ history: [{ execution_count: 1, mode: 'x', source: 'magic', duration_s: 0 }] })],
    ['a non-finite duration', statusRecord({ last_duration_s: Infinity })],
    ['a target count as a string', statusRecord({ target: { kind: 'h100', label: 'H100', count: '64', description: '' } })],
    ['a target without its description', statusRecord({ target: { kind: 'h100', label: 'H100', count: 64 } })],
    ['a target as a string', statusRecord({ target: '64 × H100' })]
  ])('both reject a record with %s', (_, value) => {
    expect(verdicts(value)).toEqual(both(false));
  });

  it.each(OBJECTS)('agree on which fields of %s are required', (_, pick, part) => {
    expect(Object.keys(part.properties)).toEqual(expect.arrayContaining(part.required));
    for (const field of Object.keys(part.properties)) {
      const record = clone(statusRecord({ memory_history: memoryHistory() })) as unknown as Dict;
      delete pick(record)[field];
      const required = part.required.includes(field);
      expect({ field, ...verdicts(record) }).toEqual({ field, ...both(!required) });
    }
  });

  it.each(OBJECTS)('agree on which fields of %s may be null', (_, pick, part) => {
    for (const field of Object.keys(part.properties)) {
      const record = clone(statusRecord({ memory_history: memoryHistory() })) as unknown as Dict;
      pick(record)[field] = null;
      const { schema: nullable } = verdicts(record);
      expect({ field, ...verdicts(record) }).toEqual({ field, ...both(nullable) });
    }
  });

  it('names every field the validator reads', () => {
    expect(Object.keys(schema.properties).sort()).toEqual(
      [...Object.keys(statusRecord()), 'memory_history'].sort()
    );
  });

  it.each([
    ['without samples', memoryHistory({ samples: undefined })],
    ['with bytes as strings', memoryHistory({ bytes: [['0', null], [1, 1], [2, 2]] })],
    ['with negative bytes', memoryHistory({ bytes: [[-1, null], [1, 1], [2, 2]] })],
    ['with a marker without text', memoryHistory({ markers: [{ t: 1, kind: 'release' }] })],
    ['as a list', [1, 2, 3]]
  ])('a memory history %s: the schema rejects it, the validator drops it', (_, history) => {
    const record = statusRecord({ memory_history: clone(history) });
    expect(schemaAccepts(record)).toBe(false);
    const kept = validateStatus(record);
    expect(kept?.memory_history).toBeNull();
    expect(schemaAccepts(kept)).toBe(true);
  });

  it('rows of the wrong length pass the schema (it cannot say so) but not the validator', () => {
    const ragged = statusRecord({ memory_history: memoryHistory({ bytes: [[0], [1, 1], [2, 2]] }) });
    const short = statusRecord({ memory_history: memoryHistory({ t: [0, 1] }) });
    for (const record of [ragged, short]) {
      expect(schemaAccepts(record)).toBe(true);
      expect(validateStatus(record)?.memory_history).toBeNull();
    }
  });
});
