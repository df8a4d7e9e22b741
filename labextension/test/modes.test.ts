import { describe, expect, it } from 'vitest';

import { SETTINGS_PLUGIN_ID } from '../src/ids';
import {
  effectiveBadge,
  metadataMode,
  modeMagicOf,
  nextMode,
  removeModeMagicLine,
  replyMode,
  setModeMagicLine
} from '../src/modes';

describe('modes', () => {
  it('cycles modes', () => {
    expect(nextMode('eager')).toBe('jit');
    expect(nextMode('jit')).toBe('graph');
    expect(nextMode('graph')).toBe('eager');
  });
});

describe('mode magic lines', () => {
  it('reads the first line as the kernel does', () => {
    expect(modeMagicOf('%%graph\nx = 1')).toBe('graph');
    expect(modeMagicOf('\n\n%%eager\nx')).toBe('eager');
    expect(modeMagicOf('%%mode jit\nx')).toBe('jit');
    expect(modeMagicOf('%%time\nx')).toBeNull();
    expect(modeMagicOf('x = 1\n%%graph')).toBeNull();
    expect(modeMagicOf('%%mode nope')).toBeNull();
  });

  it('inserts or replaces the mode line', () => {
    expect(setModeMagicLine('x = 1', 'graph')).toBe('%%graph\nx = 1');
    expect(setModeMagicLine('', 'graph')).toBe('%%graph');
    expect(setModeMagicLine('%%eager\nx = 1', 'graph')).toBe('%%graph\nx = 1');
    expect(setModeMagicLine('%%mode jit\nx = 1', 'eager')).toBe('%%eager\nx = 1');
    expect(setModeMagicLine('%%mode bogus\nx', 'eager')).toBe('%%eager\nx');
    expect(setModeMagicLine('\n%%jit\nx', 'graph')).toBe('%%graph\nx');
    expect(setModeMagicLine('%%graph', 'eager')).toBe('%%eager');
    expect(setModeMagicLine('%%time\nx', 'graph')).toBe('%%graph\n%%time\nx');
  });

  it('removes the mode line', () => {
    expect(removeModeMagicLine('%%graph\nx = 1')).toBe('x = 1');
    expect(removeModeMagicLine('x = 1')).toBe('x = 1');
    expect(removeModeMagicLine('%%jit')).toBe('');
  });
});

describe('cell badges', () => {
  it('reads metadata and reply metadata', () => {
    expect(metadataMode({ shardlab: { mode: 'graph' } })).toBe('graph');
    expect(metadataMode({ shardlab: { mode: 'nope' } })).toBeNull();
    expect(metadataMode({ shardlab: 'graph' })).toBeNull();
    expect(metadataMode(undefined)).toBeNull();
    expect(replyMode({ shardlab: { mode: 'jit', mode_source: 'default', mode_error: null } })).toEqual({
      mode: 'jit',
      source: 'default',
      error: null
    });
    expect(replyMode({})).toEqual({ mode: null, source: null, error: null });
  });

  it('shows the effective mode and how long the run took', () => {
    const badge = effectiveBadge('graph', 'graph', 'metadata', 0.012);
    expect(badge.text).toBe('graph · 12 ms');
    expect(badge.overridden).toBe(false);
    expect(badge.mode).toBe('graph');
  });

  it('flags a %%magic line that overrode the metadata', () => {
    const badge = effectiveBadge('graph', 'eager', 'magic', 1.5);
    expect(badge.text).toBe('eager · 1.5 s');
    expect(badge.overridden).toBe(true);
    expect(badge.title).toContain('overrides');
    expect(effectiveBadge('eager', 'eager', 'magic', 0.001).overridden).toBe(false);
    expect(effectiveBadge(null, 'eager', 'magic', 0.001).overridden).toBe(false);
  });

  it('before a run shows the metadata mode, or nothing', () => {
    expect(effectiveBadge('jit', null, null, null)).toMatchObject({ text: 'jit', overridden: false });
    expect(effectiveBadge(null, null, null, null).text).toBe('');
    expect(effectiveBadge(null, 'jit', 'default', null).text).toBe('jit');
  });
});

describe('ids', () => {
  it('exports the settings plugin id', () => {
    expect(SETTINGS_PLUGIN_ID).toBe('shardlab:plugin');
  });
});
