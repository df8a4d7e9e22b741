/**
 * Per-cell mode state, free of widgets: what a cell's metadata asks for, what its last
 * run did (from the execute reply), and a store of runs keyed by cell id.
 *
 * The store is keyed by cell id, not by widget, so a windowed notebook can drop a cell's
 * DOM and rebuild it; whoever renders the cell reads the store again.
 */
import { Signal } from '@lumino/signaling';
import type { ISignal } from '@lumino/signaling';

import { MODES, isMode } from './modes';
import type { Mode } from './modes';

export { MODES, isMode };

/** What the cell's control offers: the three modes, or no metadata ("default"). */
export type ModeChoice = 'default' | Mode;
export const CHOICES: readonly ModeChoice[] = ['default', 'eager', 'jit', 'graph'];

/** The cell metadata key the kernel reads: `{"shardlab": {"mode": "graph"}}`. */
export const METADATA_KEY = 'shardlab';

/** A cell's metadata mode as the kernel will read it. */
export type MetadataMode =
  | { kind: 'default' }
  | { kind: 'mode'; mode: Mode }
  | { kind: 'invalid'; raw: string };

export function isChoice(value: unknown): value is ModeChoice {
  return typeof value === 'string' && (CHOICES as readonly string[]).includes(value);
}

function show(value: unknown): string {
  if (typeof value === 'string') {
    return `'${value}'`;
  }
  try {
    return JSON.stringify(value) ?? String(value);
  } catch {
    return String(value);
  }
}

/**
 * Reads `metadata.shardlab.mode` the way the kernel does (engine/modes.py): a missing entry
 * or `mode: null` is the default; a mode name is matched case-insensitively after trimming;
 * anything else (a typo, a number, a `shardlab` entry that is not an object) is invalid.
 */
export function readMetadataMode(entry: unknown): MetadataMode {
  if (entry === undefined || entry === null) {
    return { kind: 'default' };
  }
  if (typeof entry !== 'object' || Array.isArray(entry)) {
    return { kind: 'invalid', raw: show(entry) };
  }
  const mode = (entry as Record<string, unknown>).mode;
  if (mode === undefined || mode === null) {
    return { kind: 'default' };
  }
  if (typeof mode === 'string') {
    const name = mode.trim().toLowerCase();
    if (isMode(name)) {
      return { kind: 'mode', mode: name };
    }
  }
  return { kind: 'invalid', raw: show(mode) };
}

/** The mode a metadata entry names, or null (default or invalid). */
export function metadataModeName(meta: MetadataMode): Mode | null {
  return meta.kind === 'mode' ? meta.mode : null;
}

/**
 * The metadata entry that sets `choice`, keeping other keys of an existing `shardlab`
 * object; `undefined` means "delete the key" (default with nothing else in it).
 */
export function metadataFor(
  choice: ModeChoice,
  existing: unknown
): Record<string, unknown> | undefined {
  const rest: Record<string, unknown> =
    existing && typeof existing === 'object' && !Array.isArray(existing)
      ? { ...(existing as Record<string, unknown>) }
      : {};
  delete rest.mode;
  if (choice === 'default') {
    return Object.keys(rest).length ? rest : undefined;
  }
  return { ...rest, mode: choice };
}

/** What one execution of a cell did, from its execute reply. */
export interface ICellRun {
  /** The effective mode (null when the kernel refused the cell's mode). */
  mode: Mode | null;
  /** Where the mode came from: 'magic', 'metadata' or 'default'. */
  source: string | null;
  /** The kernel's ModeError message, when the mode could not be resolved. */
  error: string | null;
  /** The metadata mode sent with the request (to tell when a %%magic overrode it). */
  requested: Mode | null;
  /** Seconds the kernel spent on the cell (reply date minus start), when known. */
  durationS: number | null;
  executionCount: number | null;
  /** 'ok', 'error' or 'aborted'. */
  status: string;
}

/** The `shardlab` entry of an execute reply's metadata, checked field by field. */
export function runFromReply(
  replyMetadata: unknown,
  content: { status?: unknown; execution_count?: unknown },
  requested: Mode | null,
  durationS: number | null
): ICellRun | null {
  if (!replyMetadata || typeof replyMetadata !== 'object') {
    return null;
  }
  const entry = (replyMetadata as Record<string, unknown>)[METADATA_KEY];
  if (!entry || typeof entry !== 'object') {
    return null;
  }
  const { mode, mode_source: source, mode_error: error } = entry as Record<string, unknown>;
  return {
    mode: isMode(mode) ? mode : null,
    source: typeof source === 'string' ? source : null,
    error: typeof error === 'string' ? error : null,
    requested,
    durationS,
    executionCount: typeof content.execution_count === 'number' ? content.execution_count : null,
    status: typeof content.status === 'string' ? content.status : 'ok'
  };
}

/** Seconds between two ISO dates, or null when either is missing or unreadable. */
export function secondsBetween(start: unknown, end: unknown): number | null {
  if (typeof start !== 'string' || typeof end !== 'string') {
    return null;
  }
  const t0 = Date.parse(start);
  const t1 = Date.parse(end);
  if (!Number.isFinite(t0) || !Number.isFinite(t1) || t1 < t0) {
    return null;
  }
  return (t1 - t0) / 1000;
}

/** The last run of each cell, by cell id; `changed` names the cell whose run changed. */
export class CellRunStore {
  constructor(private readonly _limit = 20000) {}

  get changed(): ISignal<this, string> {
    return this._changed;
  }

  get(cellId: string): ICellRun | undefined {
    return this._runs.get(cellId);
  }

  set(cellId: string, run: ICellRun): void {
    this._runs.delete(cellId); // re-insert: the map's order is the age order
    this._runs.set(cellId, run);
    if (this._runs.size > this._limit) {
      const oldest = this._runs.keys().next().value;
      if (oldest !== undefined) {
        this._runs.delete(oldest);
      }
    }
    this._changed.emit(cellId);
  }

  delete(cellId: string): void {
    if (this._runs.delete(cellId)) {
      this._changed.emit(cellId);
    }
  }

  get size(): number {
    return this._runs.size;
  }

  private _runs = new Map<string, ICellRun>();
  private _changed = new Signal<this, string>(this);
}

/** A request the tracker saw go out, waiting for its reply. */
export interface IPendingRequest {
  cellId: string;
  requested: Mode | null;
  sentAt: string | null;
}

/** The fields of a kernel message the tracker reads (a structural subset of IMessage). */
export interface IMessageLike {
  header: { msg_id: string; msg_type: string; date?: string };
  parent_header?: { msg_id?: string } | Record<string, never>;
  metadata?: unknown;
  content?: unknown;
  channel?: string;
}

/**
 * Pairs execute requests with their replies: `onMessage` takes every message a kernel
 * connection sends or receives (its `anyMessage` signal) and records a run in the store
 * for each execute_reply whose request carried a `cellId` (JupyterLab sends one).
 */
export class ReplyTracker {
  constructor(readonly store: CellRunStore, private readonly _maxPending = 2000) {}

  onMessage(msg: IMessageLike, direction: 'send' | 'recv'): void {
    const type = msg.header.msg_type;
    if (direction === 'send' && type === 'execute_request') {
      const meta = (msg.metadata ?? {}) as Record<string, unknown>;
      const cellId = meta.cellId;
      if (typeof cellId !== 'string' || !cellId) {
        return;
      }
      this._pending.set(msg.header.msg_id, {
        cellId,
        requested: metadataModeName(readMetadataMode(meta[METADATA_KEY])),
        sentAt: msg.header.date ?? null
      });
      if (this._pending.size > this._maxPending) {
        const oldest = this._pending.keys().next().value;
        if (oldest !== undefined) {
          this._pending.delete(oldest);
        }
      }
      return;
    }
    if (direction !== 'recv' || type !== 'execute_reply') {
      return;
    }
    const parentId = (msg.parent_header as { msg_id?: string } | undefined)?.msg_id;
    const pending = parentId ? this._pending.get(parentId) : undefined;
    if (!parentId || !pending) {
      return;
    }
    this._pending.delete(parentId);
    const content = (msg.content ?? {}) as { status?: unknown; execution_count?: unknown };
    const meta = (msg.metadata ?? {}) as Record<string, unknown>;
    // ipykernel puts the start of the execution into the reply metadata; without it, the
    // request's own date (which then includes the time the request waited in the queue).
    const duration =
      secondsBetween(meta.started, msg.header.date) ??
      secondsBetween(pending.sentAt, msg.header.date);
    const run = runFromReply(meta, content, pending.requested, duration);
    if (run) {
      this.store.set(pending.cellId, run);
    } else if (content.status === 'aborted') {
      this.store.delete(pending.cellId);
    }
  }

  /** Forgets requests in flight (a restarted kernel never answers them). */
  reset(): void {
    this._pending.clear();
  }

  get pendingCount(): number {
    return this._pending.size;
  }

  private _pending = new Map<string, IPendingRequest>();
}
