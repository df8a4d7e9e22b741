import { describe, expect, it } from 'vitest';

import {
  CellRunStore,
  ReplyTracker,
  metadataFor,
  readMetadataMode,
  runFromReply,
  secondsBetween
} from '../src/cellmode-model';
import type { IMessageLike } from '../src/cellmode-model';

function request(id: string, metadata: Record<string, unknown>, date = '2026-12-01T10:00:00.000Z'): IMessageLike {
  return { header: { msg_id: id, msg_type: 'execute_request', date }, parent_header: {}, metadata, content: {} };
}

function reply(
  parent: string,
  shardlab: Record<string, unknown> | null,
  extra: { started?: string; date?: string; status?: string; count?: number } = {}
): IMessageLike {
  const metadata: Record<string, unknown> = {};
  if (shardlab) {
    metadata.shardlab = shardlab;
  }
  if (extra.started) {
    metadata.started = extra.started;
  }
  return {
    header: { msg_id: `r-${parent}`, msg_type: 'execute_reply', date: extra.date ?? '2026-12-01T10:00:00.250Z' },
    parent_header: { msg_id: parent },
    metadata,
    content: { status: extra.status ?? 'ok', execution_count: extra.count ?? 3 }
  };
}

describe('readMetadataMode', () => {
  it('reads modes as the kernel does', () => {
    expect(readMetadataMode(undefined)).toEqual({ kind: 'default' });
    expect(readMetadataMode({})).toEqual({ kind: 'default' });
    expect(readMetadataMode({ mode: null })).toEqual({ kind: 'default' });
    expect(readMetadataMode({ mode: 'graph' })).toEqual({ kind: 'mode', mode: 'graph' });
    expect(readMetadataMode({ mode: ' JIT ' })).toEqual({ kind: 'mode', mode: 'jit' });
  });

  it('names an invalid value', () => {
    expect(readMetadataMode({ mode: 'grpah' })).toEqual({ kind: 'invalid', raw: "'grpah'" });
    expect(readMetadataMode({ mode: 3 })).toEqual({ kind: 'invalid', raw: '3' });
    expect(readMetadataMode('graph')).toEqual({ kind: 'invalid', raw: "'graph'" });
    expect(readMetadataMode([1])).toEqual({ kind: 'invalid', raw: '[1]' });
  });
});

describe('metadataFor', () => {
  it('removes the key for default and keeps other keys', () => {
    expect(metadataFor('default', { mode: 'jit' })).toBeUndefined();
    expect(metadataFor('default', undefined)).toBeUndefined();
    expect(metadataFor('default', { mode: 'jit', note: 1 })).toEqual({ note: 1 });
    expect(metadataFor('graph', { mode: 'jit', note: 1 })).toEqual({ note: 1, mode: 'graph' });
    expect(metadataFor('eager', 'garbage')).toEqual({ mode: 'eager' });
  });
});

describe('runFromReply and secondsBetween', () => {
  it('reads the shardlab entry, field by field', () => {
    const run = runFromReply(
      { shardlab: { mode: 'graph', mode_source: 'magic', mode_error: null } },
      { status: 'ok', execution_count: 7 },
      'jit',
      0.012
    );
    expect(run).toEqual({
      mode: 'graph',
      source: 'magic',
      error: null,
      requested: 'jit',
      durationS: 0.012,
      executionCount: 7,
      status: 'ok'
    });
    expect(runFromReply({}, {}, null, null)).toBeNull();
    expect(runFromReply({ shardlab: { mode: 'bogus', mode_error: 'bad' } }, {}, null, null)?.mode).toBeNull();
  });

  it('measures ISO dates', () => {
    expect(secondsBetween('2026-12-01T10:00:00.000Z', '2026-12-01T10:00:01.500Z')).toBe(1.5);
    expect(secondsBetween(undefined, '2026-12-01T10:00:01Z')).toBeNull();
    expect(secondsBetween('2026-12-01T10:00:02Z', '2026-12-01T10:00:01Z')).toBeNull();
  });
});

describe('ReplyTracker', () => {
  it('pairs a reply with its request cell and times it from `started`', () => {
    const store = new CellRunStore();
    const changed: string[] = [];
    store.changed.connect((_, id) => changed.push(id));
    const tracker = new ReplyTracker(store);
    tracker.onMessage(request('m1', { cellId: 'cell-a', shardlab: { mode: 'jit' } }), 'send');
    expect(tracker.pendingCount).toBe(1);
    tracker.onMessage(
      reply('m1', { mode: 'graph', mode_source: 'magic', mode_error: null }, { started: '2026-12-01T10:00:00.200Z' }),
      'recv'
    );
    expect(tracker.pendingCount).toBe(0);
    const run = store.get('cell-a');
    expect(run?.mode).toBe('graph');
    expect(run?.requested).toBe('jit');
    expect(run?.durationS).toBeCloseTo(0.05, 6);
    expect(changed).toEqual(['cell-a']);
  });

  it('falls back to the request date and ignores messages it does not own', () => {
    const store = new CellRunStore();
    const tracker = new ReplyTracker(store);
    tracker.onMessage(request('m2', { cellId: 'cell-b' }), 'send');
    tracker.onMessage(request('m3', {}), 'send'); // no cellId: a console, a silent helper
    tracker.onMessage(reply('unknown', { mode: 'jit' }), 'recv');
    tracker.onMessage(reply('m2', { mode: 'jit', mode_source: 'default' }), 'recv');
    expect(store.get('cell-b')?.durationS).toBeCloseTo(0.25, 6);
    expect(store.size).toBe(1);
  });

  it('records nothing for a stock kernel, forgets an aborted cell, and resets', () => {
    const store = new CellRunStore();
    const tracker = new ReplyTracker(store);
    tracker.onMessage(request('m4', { cellId: 'cell-c' }), 'send');
    tracker.onMessage(reply('m4', null), 'recv');
    expect(store.get('cell-c')).toBeUndefined();

    tracker.onMessage(request('m5', { cellId: 'cell-c' }), 'send');
    tracker.onMessage(reply('m5', { mode: 'eager', mode_source: 'metadata' }), 'recv');
    expect(store.get('cell-c')?.mode).toBe('eager');
    tracker.onMessage(request('m6', { cellId: 'cell-c' }), 'send');
    tracker.onMessage(reply('m6', null, { status: 'aborted' }), 'recv');
    expect(store.get('cell-c')).toBeUndefined();

    tracker.onMessage(request('m7', { cellId: 'cell-d' }), 'send');
    tracker.reset();
    tracker.onMessage(reply('m7', { mode: 'jit' }), 'recv');
    expect(store.get('cell-d')).toBeUndefined();
  });

  it('keeps its maps bounded', () => {
    const store = new CellRunStore(3);
    const tracker = new ReplyTracker(store, 2);
    for (let i = 0; i < 5; i++) {
      tracker.onMessage(request(`p${i}`, { cellId: `c${i}` }), 'send');
    }
    expect(tracker.pendingCount).toBe(2);
    for (let i = 0; i < 5; i++) {
      store.set(`s${i}`, { mode: 'jit', source: 'default', error: null, requested: null, durationS: null, executionCount: i, status: 'ok' });
    }
    expect(store.size).toBe(3);
    expect(store.get('s0')).toBeUndefined();
    expect(store.get('s4')?.executionCount).toBe(4);
  });
});
