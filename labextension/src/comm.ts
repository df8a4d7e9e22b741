/**
 * The comm client: one `ShardlabConnection` per session context, talking to the kernel's
 * `shardlab` comm target (python/shardlab/kernel/status.py).
 *
 * The connection opens its comm only where the kernel advertises the target (a
 * `comm_info` request for target `shardlab` lists the kernel's dormant comm), so a stock
 * kernel sees nothing but that request: no comm, no error, nothing in the console. Until the
 * target is found it asks again after each execution (`%load_ext shardlab` registers it
 * late). It follows kernel changes and restarts.
 */
import type { ISessionContext } from '@jupyterlab/apputils';
import type { Kernel, KernelMessage } from '@jupyterlab/services';
import type { IDisposable } from '@lumino/disposable';
import { Signal } from '@lumino/signaling';
import type { ISignal } from '@lumino/signaling';

import type { Mode } from './modes';
import {
  COMM_TARGET,
  errorMessage,
  parseDevicesReply,
  parseReleaseReply,
  parseStatusMessage
} from './protocol';
import type { IReleaseResult, IDevicesResult, IShardlabStatus } from './protocol';

export type { Mode } from './modes';
export type { IShardlabStatus } from './protocol';

interface IPending {
  resolve: (value: any) => void;
  reject: (reason: Error) => void;
}

let requestCounter = 0;

export class ShardlabConnection implements IDisposable {
  constructor(context: ISessionContext) {
    this._context = context;
    context.kernelChanged.connect(this._onKernelChanged, this);
    context.statusChanged.connect(this._onKernelStatus, this);
    context.iopubMessage.connect(this._onIopub, this);
    context.disposed.connect(this.dispose, this);
    this._attach(context.session?.kernel ?? null);
  }

  /** Emits the new record, or null when the kernel is not (or no longer) shardlab's. */
  get statusChanged(): ISignal<ShardlabConnection, IShardlabStatus | null> {
    return this._statusChanged;
  }

  /** The last status record, null before one arrived or without a shardlab comm. */
  get status(): IShardlabStatus | null {
    return this._status;
  }

  /** A comm to target `shardlab` is open (shardlab kernel, or `%load_ext shardlab`). */
  get isShardlab(): boolean {
    return this._comm !== null;
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  /** Sends a request; resolves with the reply whose id matches, rejects on an error reply. */
  request<T = any>(data: { request: string; [k: string]: unknown }): Promise<T> {
    const comm = this._comm;
    if (comm === null || comm.isDisposed) {
      return Promise.reject(new Error('shardlab: the kernel has no shardlab comm'));
    }
    const id = `shardlab-${++requestCounter}-${Date.now().toString(36)}`;
    return new Promise<T>((resolve, reject) => {
      this._pending.set(id, { resolve, reject });
      try {
        comm.send({ ...data, id } as any);
      } catch (error) {
        this._pending.delete(id);
        reject(error instanceof Error ? error : new Error(String(error)));
      }
    });
  }

  /** Asks for the status record now (the reply also updates `status`). */
  async refresh(): Promise<IShardlabStatus | null> {
    const reply = await this.request({ request: 'status' });
    return parseStatusMessage(reply);
  }

  async release(): Promise<IReleaseResult> {
    const reply = await this.request({ request: 'release' });
    const result = parseReleaseReply(reply);
    if (result === null) {
      throw new Error('shardlab: malformed release reply');
    }
    return result;
  }

  async setDefaultMode(mode: Mode): Promise<void> {
    await this.request({ request: 'set_default_mode', mode });
  }

  async switchDevices(spec: string): Promise<IDevicesResult> {
    const reply = await this.request({ request: 'switch_devices', spec });
    const result = parseDevicesReply(reply);
    if (result === null) {
      throw new Error('shardlab: malformed switch_devices reply');
    }
    return result;
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    this._detach();
    this._context.kernelChanged.disconnect(this._onKernelChanged, this);
    this._context.statusChanged.disconnect(this._onKernelStatus, this);
    this._context.iopubMessage.disconnect(this._onIopub, this);
    this._context.disposed.disconnect(this.dispose, this);
    Signal.clearData(this);
  }

  // -- kernel lifecycle -----------------------------------------------------------------
  private _onKernelChanged(): void {
    this._attach(this._context.session?.kernel ?? null);
  }

  private _onKernelStatus(_: ISessionContext, status: Kernel.Status): void {
    if (status === 'restarting' || status === 'autorestarting' || status === 'dead') {
      this._restarting = true;
      this._detach();
    } else if (status === 'idle' && this._restarting) {
      this._restarting = false;
      this._attach(this._context.session?.kernel ?? null);
    }
  }

  private _onIopub(_: ISessionContext, msg: KernelMessage.IMessage): void {
    // After each execution, a kernel without the target may have gained it (%load_ext).
    if (
      this._comm === null &&
      msg.header.msg_type === 'status' &&
      (msg.content as KernelMessage.IStatusMsg['content']).execution_state === 'idle' &&
      (msg.parent_header as Partial<KernelMessage.IHeader>)?.msg_type === 'execute_request'
    ) {
      void this._check();
    }
  }

  private _attach(kernel: Kernel.IKernelConnection | null): void {
    this._detach();
    this._kernel = kernel;
    void this._check();
  }

  /** Closes the comm and forgets the kernel's state; emits null if there was a status. */
  private _detach(): void {
    const comm = this._comm;
    this._comm = null;
    this._generation++;
    if (comm !== null && !comm.isDisposed) {
      try {
        comm.close();
      } catch {
        // the kernel is gone: nothing to close
      }
    }
    for (const pending of this._pending.values()) {
      pending.reject(new Error('shardlab: the kernel connection changed'));
    }
    this._pending.clear();
    const had = this._status !== null || comm !== null;
    this._status = null;
    if (had && !this._isDisposed) {
      this._statusChanged.emit(null);
    }
  }

  /** Opens the comm if the kernel advertises the target; at most one check at a time. */
  private async _check(): Promise<void> {
    const kernel = this._kernel;
    const generation = this._generation;
    if (
      kernel === null ||
      kernel.isDisposed ||
      this._comm !== null ||
      this._checking === generation
    ) {
      return;
    }
    this._checking = generation;
    let found = false;
    try {
      const reply = await kernel.requestCommInfo({ target_name: COMM_TARGET });
      const content = reply.content as any;
      found =
        content?.status === 'ok' &&
        Object.values(content.comms ?? {}).some((c: any) => c?.target_name === COMM_TARGET);
    } catch {
      found = false; // no kernel, a kernel without comms: not a shardlab kernel
    } finally {
      if (this._checking === generation) {
        this._checking = null;
      }
    }
    if (!found || this._isDisposed || generation !== this._generation || this._comm !== null) {
      return;
    }
    this._open(kernel);
  }

  private _open(kernel: Kernel.IKernelConnection): void {
    let comm: Kernel.IComm;
    try {
      comm = kernel.createComm(COMM_TARGET);
    } catch {
      return;
    }
    this._comm = comm;
    const generation = this._generation;
    comm.onMsg = msg => {
      if (generation === this._generation) {
        this._onMessage(msg.content.data);
      }
    };
    comm.onClose = () => {
      if (generation === this._generation && this._comm === comm) {
        this._comm = null;
        this._detach();
      }
    };
    try {
      comm.open({});
    } catch {
      this._comm = null;
    }
  }

  private _onMessage(data: unknown): void {
    const id = (data as any)?.id;
    const status = parseStatusMessage(data);
    if (status !== null) {
      this._status = status;
      this._statusChanged.emit(status);
    }
    if (typeof id === 'string' && this._pending.has(id)) {
      const pending = this._pending.get(id)!;
      this._pending.delete(id);
      const error = errorMessage(data);
      if (error !== null) {
        pending.reject(new Error(error));
      } else {
        pending.resolve(data);
      }
    }
  }

  private _context: ISessionContext;
  private _kernel: Kernel.IKernelConnection | null = null;
  private _comm: Kernel.IComm | null = null;
  private _status: IShardlabStatus | null = null;
  private _pending = new Map<string, IPending>();
  private _checking: number | null = null; // the generation being checked
  private _restarting = false;
  private _generation = 0;
  private _isDisposed = false;
  private _statusChanged = new Signal<ShardlabConnection, IShardlabStatus | null>(this);
}

const connections = new WeakMap<ISessionContext, ShardlabConnection>();

/** The connection of a session context: one per context, created on first use. */
export function connectionFor(context: ISessionContext): ShardlabConnection {
  let connection = connections.get(context);
  if (connection === undefined || connection.isDisposed) {
    connection = new ShardlabConnection(context);
    connections.set(context, connection);
  }
  return connection;
}
