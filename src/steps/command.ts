import { spawn } from 'node:child_process';
import { monotonicMark, msSince, toMs, type Duration } from '../engine/core/duration.js';
import { ConfigError, StepTimeoutError } from '../engine/core/errors.js';
import { stepTimeoutMs, type StepOptions } from './step.js';

export interface ExecOptions {
  command: string;
  args?: readonly string[];
  cwd?: string;
  /** Added to the worker's environment (a value `undefined` removes a variable). */
  env?: Record<string, string | undefined>;
  /** How long one attempt may run; past it the group is killed (TERM, then KILL after `grace`) and the attempt fails with STEP_TIMEOUT. */
  timeout?: Duration;
  /** Between SIGTERM and SIGKILL to the process group; default 5 s. */
  grace?: Duration;
  /** How much of the end of stdout and stderr the result keeps, in bytes; default 4096 each. */
  tailBytes?: number;
  /**
   * Keep the whole output (up to MAX_KEPT_OUTPUT_BYTES of each stream, the rest cut off):
   * ctx.exec stores it as the run's artifacts `<name>.stdout` and `<name>.stderr` (kind
   * 'value': content its checkpoint refers to; the result names them); runCommand returns it
   * as Buffers.
   */
  keepOutput?: boolean;
  retry?: StepOptions['retry'];
  rateLimit?: string;
}

export interface ExecResult {
  /** The exit code, or null when a signal ended the process. A non-zero code is a result, not a failure: check it. */
  exitCode: number | null;
  /** The signal that ended the process ('SIGKILL' after a kill that needed it), or null. */
  signal: string | null;
  stdoutTail: string;
  stderrTail: string;
  durationMs: number;
  /** With keepOutput: the whole stdout, an artifact of the run (engine.readArtifact); null when there was none. */
  stdoutArtifact?: ExecOutputArtifact | null;
  stderrArtifact?: ExecOutputArtifact | null;
}

export interface ExecOutputArtifact {
  artifactId: string;
  sha256: string;
  /** Bytes stored (with a codec: of the stored envelope). */
  size: number;
  /** The stream was longer than MAX_KEPT_OUTPUT_BYTES: the first part is stored (the tail has the end). */
  truncated: boolean;
}

/** What runCommand gives: the result, and with keepOutput the whole output. */
export interface CommandResult extends ExecResult {
  stdout?: Buffer;
  stderr?: Buffer;
  /** True when a stream was cut at MAX_KEPT_OUTPUT_BYTES. */
  stdoutTruncated?: boolean;
  stderrTruncated?: boolean;
}

/** The most of each stream keepOutput keeps. */
export const MAX_KEPT_OUTPUT_BYTES = 64 * 1024 * 1024;

const GRACE_DEFAULT_MS = 5_000;
const TAIL_DEFAULT_BYTES = 4_096;

/** The last `limit` bytes of a stream, kept as it arrives. */
class Tail {
  #chunks: Buffer[] = [];
  #size = 0;
  constructor(readonly limit: number) {}
  push(chunk: Buffer): void {
    this.#chunks.push(chunk);
    this.#size += chunk.length;
    while (this.#chunks.length > 1 && this.#size - this.#chunks[0]!.length >= this.limit) this.#size -= this.#chunks.shift()!.length;
  }
  /**
   * As text a checkpoint can hold: a command's output may be binary, and a NUL (which jsonb
   * refuses) would fail the step; each becomes U+FFFD, as bytes that are not UTF-8 do.
   */
  toString(): string {
    const all = Buffer.concat(this.#chunks);
    return all
      .subarray(Math.max(0, all.length - this.limit))
      .toString('utf8')
      .replaceAll('\u0000', '\uFFFD');
  }
}

/** The first MAX_KEPT_OUTPUT_BYTES of a stream (keepOutput). */
class Whole {
  #chunks: Buffer[] = [];
  #size = 0;
  truncated = false;
  push(chunk: Buffer): void {
    const room = MAX_KEPT_OUTPUT_BYTES - this.#size;
    if (chunk.length > room) this.truncated = true;
    if (room <= 0) return;
    const kept = chunk.length > room ? chunk.subarray(0, room) : chunk;
    this.#chunks.push(kept);
    this.#size += kept.length;
  }
  get bytes(): Buffer {
    return Buffer.concat(this.#chunks);
  }
}

function signalGroup(pgid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pgid, signal);
  } catch {
    // The group is gone already.
  }
}

/** SIGTERM to the whole group, SIGKILL after `graceMs` if it has not exited; resolves once it has. */
function killGroup(pgid: number, exited: Promise<unknown>, graceMs: number): Promise<void> {
  signalGroup(pgid, 'SIGTERM');
  const timer = setTimeout(() => signalGroup(pgid, 'SIGKILL'), graceMs);
  return exited.then(() => {
    clearTimeout(timer);
    // A grandchild that left the leader's exit behind still belongs to the group.
    signalGroup(pgid, 'SIGKILL');
  });
}

/**
 * A process group outlives a worker that dies (SIGKILL, OOM): a watcher, a shell outside the
 * group reading a pipe from the worker, sees the pipe close when the worker dies and kills the
 * group (TERM, then KILL after the grace). On a normal end the worker kills the watcher.
 */
function watchForWorkerDeath(pgid: number, graceMs: number): () => void {
  const graceSeconds = Math.max(0, Math.ceil(graceMs / 1000));
  const watcher = spawn(
    'sh',
    ['-c', 'read _; kill -TERM -"$1" 2>/dev/null; sleep "$2"; kill -KILL -"$1" 2>/dev/null', 'watcher', String(pgid), String(graceSeconds)],
    {
      stdio: ['pipe', 'ignore', 'ignore'],
    },
  );
  watcher.on('error', () => {}); // no shell: the group is then only killed by a live worker
  watcher.stdin?.on('error', () => {});
  return () => {
    try {
      watcher.kill('SIGKILL');
    } catch {
      // gone already
    }
  };
}

export function checkCommandOptions(
  name: string,
  options: ExecOptions,
): { graceMs: number; timeoutMs: number | undefined; tailBytes: number } {
  const what = `exec ${JSON.stringify(name)}`;
  if (typeof options !== 'object' || options === null || typeof options.command !== 'string' || options.command === '')
    throw new ConfigError(`${what}: options.command must be a non-empty string`);
  if (options.args !== undefined && (!Array.isArray(options.args) || options.args.some((a) => typeof a !== 'string')))
    throw new ConfigError(`${what}: args must be a list of strings`);
  const tailBytes = options.tailBytes ?? TAIL_DEFAULT_BYTES;
  if (!Number.isInteger(tailBytes) || tailBytes < 0 || tailBytes > 1_048_576)
    throw new ConfigError(`${what}: tailBytes must be a whole number from 0 to 1048576`);
  if (options.keepOutput !== undefined && typeof options.keepOutput !== 'boolean')
    throw new ConfigError(`${what}: keepOutput must be true or false`);
  return {
    graceMs: options.grace === undefined ? GRACE_DEFAULT_MS : toMs(options.grace, `${what}: grace`),
    timeoutMs: stepTimeoutMs(options.timeout, `${what}: timeout`),
    tailBytes,
  };
}

/** What runCommand needs besides the options: the signal that kills it, and the hooks ctx.exec gives. */
export interface CommandControl {
  /** Aborting it kills the group (the step's or tool's signal: cancel, lost lease). */
  signal: AbortSignal;
  /** Names the command in errors; default the command. */
  name?: string;
  attempt?: number;
  /** Kill at this many ms from now too (the run's deadline); the call then fails. */
  deadlineMs?: number;
  /** Given the kill while it is under way (ctx.exec holds a cancelled run's end on it). */
  onKill?: (killed: Promise<void>) => void;
}

/**
 * The kill rules of ctx.exec, for a command run inside a step or a tool of your own (given
 * its signal): a process group of its own, SIGTERM then SIGKILL after `grace` when the
 * signal fires or `timeout` passes (STEP_TIMEOUT), a watcher that kills the group if this
 * process dies, nothing left of the group once the command exits. Not a step by itself.
 */
export function runCommand(options: ExecOptions, control: CommandControl): Promise<CommandResult> {
  const name = control.name ?? options?.command;
  const { graceMs, timeoutMs, tailBytes } = checkCommandOptions(name, options);
  const { signal, attempt = 1, deadlineMs } = control;
  return new Promise<CommandResult>((resolve, reject) => {
    const startedAt = monotonicMark();
    const stdout = new Tail(tailBytes);
    const stderr = new Tail(tailBytes);
    const whole = options.keepOutput ? { stdout: new Whole(), stderr: new Whole() } : undefined;
    const env = { ...process.env };
    for (const [key, value] of Object.entries(options.env ?? {})) {
      if (value === undefined) delete env[key];
      else env[key] = value;
    }
    const child = spawn(options.command, options.args ?? [], {
      cwd: options.cwd,
      env,
      detached: true, // its own process group: a kill reaches what it started too
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let timedOut = false;
    let pastDeadline = false;
    let killing: Promise<void> | undefined;
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((done) =>
      child.once('close', (code, sig) => done({ code, signal: sig })),
    );
    const stopWatcher = child.pid === undefined ? () => {} : watchForWorkerDeath(child.pid, graceMs);
    // Nothing the command started outlives it: once it exits, what is left of its group is
    // killed (a background job holding its output open would otherwise hold the step).
    child.once('exit', () => child.pid !== undefined && signalGroup(child.pid, 'SIGKILL'));
    child.stdout!.on('data', (chunk: Buffer) => (stdout.push(chunk), whole?.stdout.push(chunk)));
    child.stderr!.on('data', (chunk: Buffer) => (stderr.push(chunk), whole?.stderr.push(chunk)));
    const kill = () => {
      if (killing || child.pid === undefined) return;
      killing = killGroup(child.pid, exited, graceMs);
      control.onKill?.(killing);
    };
    const onAbort = () => kill();
    signal.addEventListener('abort', onAbort, { once: true });
    const timer = timeoutMs === undefined ? undefined : setTimeout(() => ((timedOut = true), kill()), timeoutMs);
    const deadlineTimer =
      deadlineMs === undefined || deadlineMs > 2 ** 31 - 1 ? undefined : setTimeout(() => ((pastDeadline = true), kill()), deadlineMs);
    const settled = () => {
      clearTimeout(timer);
      clearTimeout(deadlineTimer);
      signal.removeEventListener('abort', onAbort);
    };
    child.once('error', (error) => {
      settled();
      stopWatcher();
      reject(error);
    });
    void exited.then(async (end) => {
      settled();
      if (killing) await killing;
      stopWatcher();
      if (child.pid === undefined) return; // spawn failed: 'error' rejected
      const result: CommandResult = {
        exitCode: end.code,
        signal: end.signal,
        stdoutTail: stdout.toString(),
        stderrTail: stderr.toString(),
        durationMs: Math.round(msSince(startedAt)),
        ...(whole && {
          stdout: whole.stdout.bytes,
          stderr: whole.stderr.bytes,
          stdoutTruncated: whole.stdout.truncated,
          stderrTruncated: whole.stderr.truncated,
        }),
      };
      if (timedOut) {
        reject(
          new StepTimeoutError(`exec ${JSON.stringify(name)} attempt ${attempt} ran past its timeout of ${timeoutMs} ms and was killed`, {
            step: name,
            attempt,
            timeoutMs,
            signal: end.signal,
            stderrTail: result.stderrTail.slice(-500),
          }),
        );
      } else if (pastDeadline) {
        // The failure's write is refused past the deadline (RL009): the run ends TERMINATED, DEADLINE.
        reject(new Error(`exec ${JSON.stringify(name)} was killed at the run's deadline`));
      } else if (signal.aborted)
        reject(signal.reason instanceof Error ? signal.reason : new Error(`exec ${name}: ${String(signal.reason)}`));
      else resolve(result);
    });
    if (signal.aborted) kill();
  });
}
