import type { RunnableConfig } from '@langchain/core/runnables';
import {
  BaseCheckpointSaver,
  TASKS,
  WRITES_IDX_MAP,
  maxChannelVersion,
  type ChannelVersions,
  type Checkpoint,
  type CheckpointListOptions,
  type CheckpointMetadata,
  type CheckpointPendingWrite,
  type CheckpointTuple,
  type PendingWrite,
  type SerializerProtocol,
} from '@langchain/langgraph-checkpoint';
import pg from 'pg';
import { ConfigError, createEngine } from '../index.js';

export interface RunledgerSaverOptions {
  /** The schema runledger lives in; only 'runledger' (the default) is supported. */
  schema?: 'runledger';
  serde?: SerializerProtocol;
}

/** What the saver needs of a connection: a pg Pool (the engine's `engine.pool` serves). */
export type SaverPool = Pick<pg.Pool, 'query'>;

const SELECT = `select c.thread_id, c.checkpoint_ns, c.checkpoint_id, c.parent_checkpoint_id, c.checkpoint, c.metadata,
  (select coalesce(json_agg(json_build_array(b.channel, b.type, encode(b.blob, 'base64'))), '[]')
     from jsonb_each_text(c.checkpoint -> 'channel_versions') v
     join runledger.graph_blobs b
       on b.thread_id = c.thread_id and b.checkpoint_ns = c.checkpoint_ns and b.channel = v.key and b.version = v.value) as channel_values,
  (select coalesce(json_agg(json_build_array(w.task_id, w.channel, w.type, encode(w.blob, 'base64'))
                            order by w.task_path, w.task_id, w.idx), '[]')
     from runledger.graph_writes w
    where w.thread_id = c.thread_id and w.checkpoint_ns = c.checkpoint_ns and w.checkpoint_id = c.checkpoint_id) as pending_writes
  from runledger.graph_checkpoints c`;

/**
 * The configurable keys runGraph sets on each invoke: the run that writes through the saver
 * and the fencing token its execution holds. Carried in LangGraph's config, not on the
 * saver, so one compiled graph serves many runs at once; with them every write is fenced.
 */
export const RUN_ID_KEY = 'runledger_run_id';
export const FENCING_TOKEN_KEY = 'runledger_fencing_token';

function writer(config: RunnableConfig): { runId: string | null; token: string | null } {
  const configurable = (config.configurable ?? {}) as Record<string, unknown>;
  const runId = typeof configurable[RUN_ID_KEY] === 'string' ? configurable[RUN_ID_KEY] : null;
  const token = typeof configurable[FENCING_TOKEN_KEY] === 'string' ? configurable[FENCING_TOKEN_KEY] : null;
  return { runId, token: runId === null ? null : token };
}

interface Row {
  thread_id: string;
  checkpoint_ns: string;
  checkpoint_id: string;
  parent_checkpoint_id: string | null;
  checkpoint: Omit<Checkpoint, 'channel_values'>;
  metadata: CheckpointMetadata;
  channel_values: Array<[string, string, string | null]>;
  pending_writes: Array<[string, string, string, string]>;
}

/**
 * `RunledgerSaver`: a LangGraph.js checkpointer (BaseCheckpointSaver) whose checkpoints and
 * pending writes live in runledger's schema (`runledger.graph_checkpoints`, `graph_blobs`,
 * `graph_writes`, the view `runledger.graph_threads`), readable from SQL beside the runs
 * that wrote them. A put is one round trip (runledger._graph_put). Used on its own like the
 * official PostgresSaver (`fromConnString`, `setup()`), or by `runGraph`, which runs a
 * thread as a runledger run.
 */
export class RunledgerSaver extends BaseCheckpointSaver {
  readonly pool: SaverPool;
  #ownPool: pg.Pool | undefined;
  #url: string | undefined;

  constructor(pool: SaverPool, options: RunledgerSaverOptions = {}) {
    super(options.serde);
    if (options.schema !== undefined && options.schema !== 'runledger') {
      throw new ConfigError(`RunledgerSaver: the schema is runledger's own ('runledger'), not ${JSON.stringify(options.schema)}`);
    }
    this.pool = pool;
  }

  /** A saver on its own pool; `setup()` migrates the schema, `end()` closes the pool. */
  static fromConnString(connectionString: string, options: RunledgerSaverOptions = {}): RunledgerSaver {
    const pool = new pg.Pool({ connectionString });
    const saver = new RunledgerSaver(pool, options);
    saver.#ownPool = pool;
    saver.#url = connectionString;
    return saver;
  }

  /** Applies runledger's migrations (the graph tables among them), as engine.migrate() does; safe to call again. */
  async setup(): Promise<void> {
    if (!this.#url) return;
    const engine = createEngine({ connectionString: this.#url, log: () => {} });
    try {
      await engine.migrate();
    } finally {
      await engine.close();
    }
  }

  async end(): Promise<void> {
    await this.#ownPool?.end();
  }

  async getTuple(config: RunnableConfig): Promise<CheckpointTuple | undefined> {
    const { thread_id, checkpoint_ns = '', checkpoint_id } = (config.configurable ?? {}) as Record<string, string | undefined>;
    if (thread_id === undefined) return undefined;
    const { rows } = checkpoint_id
      ? await this.pool.query<Row>(`${SELECT} where c.thread_id = $1 and c.checkpoint_ns = $2 and c.checkpoint_id = $3`, [
          thread_id,
          checkpoint_ns,
          checkpoint_id,
        ])
      : await this.pool.query<Row>(`${SELECT} where c.thread_id = $1 and c.checkpoint_ns = $2 order by c.checkpoint_id desc limit 1`, [
          thread_id,
          checkpoint_ns,
        ]);
    return rows[0] ? this.#tuple(rows[0]) : undefined;
  }

  async *list(config: RunnableConfig, options: CheckpointListOptions = {}): AsyncGenerator<CheckpointTuple> {
    const { filter, before, limit } = options;
    const where: string[] = [];
    const args: unknown[] = [];
    const configurable = (config?.configurable ?? {}) as Record<string, unknown>;
    const add = (clause: string, value: unknown) => {
      args.push(value);
      where.push(clause.replace('?', `$${args.length}`));
    };
    if (configurable.thread_id) add('c.thread_id = ?', configurable.thread_id);
    if (configurable.checkpoint_ns !== undefined && configurable.checkpoint_ns !== null)
      add('c.checkpoint_ns = ?', configurable.checkpoint_ns);
    if (configurable.checkpoint_id) add('c.checkpoint_id = ?', configurable.checkpoint_id);
    if (filter && Object.keys(filter).length > 0) add('c.metadata @> ?::jsonb', JSON.stringify(filter));
    const beforeId = (before?.configurable as Record<string, unknown> | undefined)?.checkpoint_id;
    if (beforeId !== undefined) add('c.checkpoint_id < ?', beforeId);
    let sql = `${SELECT}${where.length ? ` where ${where.join(' and ')}` : ''} order by c.checkpoint_id desc`;
    if (limit !== undefined) sql += ` limit ${Math.max(0, Math.floor(Number(limit)))}`;
    const { rows } = await this.pool.query<Row>(sql, args);
    for (const row of rows) yield await this.#tuple(row);
  }

  /**
   * Checkpoints written before LangGraph's format 4 kept the sends of a step as writes to
   * TASKS of the parent checkpoint; read, they are moved into the checkpoint's TASKS channel,
   * as LangGraph's own savers do.
   */
  async #migratePendingSends(row: Row): Promise<void> {
    if (row.checkpoint.v >= 4 || !row.parent_checkpoint_id) return;
    const { rows } = await this.pool.query<{ type: string; blob: string }>(
      `select w.type, encode(w.blob, 'base64') as blob from runledger.graph_writes w
        where w.thread_id = $1 and w.checkpoint_ns = $2 and w.checkpoint_id = $3 and w.channel = $4
        order by w.task_path, w.task_id, w.idx`,
      [row.thread_id, row.checkpoint_ns, row.parent_checkpoint_id, TASKS],
    );
    if (rows.length === 0) return;
    const sends = await Promise.all(rows.map((send) => this.serde.loadsTyped(send.type, Buffer.from(send.blob, 'base64'))));
    const [type, bytes] = await this.serde.dumpsTyped(sends);
    row.channel_values.push([TASKS, type, Buffer.from(bytes).toString('base64')]);
    const versions = row.checkpoint.channel_versions ?? {};
    row.checkpoint.channel_versions = {
      ...versions,
      [TASKS]: Object.keys(versions).length > 0 ? maxChannelVersion(...Object.values(versions)) : this.getNextVersion(undefined),
    };
  }

  async put(
    config: RunnableConfig,
    checkpoint: Checkpoint,
    metadata: CheckpointMetadata,
    newVersions: ChannelVersions,
  ): Promise<RunnableConfig> {
    if (config.configurable === undefined) throw new Error('Missing "configurable" field in "config" param');
    const { thread_id, checkpoint_ns = '', checkpoint_id } = config.configurable as Record<string, string | undefined>;
    const { channel_values: values, ...stored } = checkpoint;
    const channels: string[] = [];
    const versions: string[] = [];
    const types: string[] = [];
    const blobs: Array<Buffer | null> = [];
    for (const [channel, version] of Object.entries(newVersions)) {
      channels.push(channel);
      versions.push(String(version));
      if (channel in values) {
        const [type, bytes] = await this.serde.dumpsTyped((values as Record<string, unknown>)[channel]);
        types.push(type);
        blobs.push(Buffer.from(bytes));
      } else {
        types.push('empty');
        blobs.push(null);
      }
    }
    const [, metadataBytes] = await this.serde.dumpsTyped(metadata);
    const metadataJson = new TextDecoder().decode(metadataBytes).replace(/\\u0000|\0/g, '');
    const { runId, token } = writer(config);
    await this.pool.query(
      'select runledger._graph_put(p_thread_id => $1, p_ns => $2, p_checkpoint_id => $3, p_parent_id => $4, p_checkpoint => $5, ' +
        'p_metadata => $6::jsonb, p_channels => $7, p_versions => $8, p_types => $9, p_blobs => $10, p_run_id => $11, p_token => $12)',
      [
        thread_id,
        checkpoint_ns,
        checkpoint.id,
        checkpoint_id ?? null,
        stored,
        metadataJson,
        channels,
        versions,
        types,
        blobs,
        runId,
        token,
      ],
    );
    return { configurable: { thread_id, checkpoint_ns, checkpoint_id: checkpoint.id } };
  }

  async putWrites(config: RunnableConfig, writes: PendingWrite[], taskId: string, taskPath = ''): Promise<void> {
    const { thread_id, checkpoint_ns = '', checkpoint_id } = (config.configurable ?? {}) as Record<string, string | undefined>;
    const idx: number[] = [];
    const channels: string[] = [];
    const types: string[] = [];
    const blobs: Buffer[] = [];
    for (const [i, [channel, value]] of writes.entries()) {
      const [type, bytes] = await this.serde.dumpsTyped(value);
      idx.push(WRITES_IDX_MAP[channel] ?? i);
      channels.push(channel);
      types.push(type);
      blobs.push(Buffer.from(bytes));
    }
    const replace = writes.every(([channel]) => channel in WRITES_IDX_MAP);
    const { runId, token } = writer(config);
    await this.pool.query(
      'select runledger._graph_put_writes(p_thread_id => $1, p_ns => $2, p_checkpoint_id => $3, p_task_id => $4, p_task_path => $5, ' +
        'p_idx => $6, p_channels => $7, p_types => $8, p_blobs => $9, p_replace => $10, p_run_id => $11, p_token => $12)',
      [thread_id, checkpoint_ns, checkpoint_id, taskId, taskPath, idx, channels, types, blobs, replace, runId, token],
    );
  }

  async deleteThread(threadId: string): Promise<void> {
    await this.pool.query('select runledger._graph_delete_thread(p_thread_id => $1)', [threadId]);
  }

  async #tuple(row: Row): Promise<CheckpointTuple> {
    await this.#migratePendingSends(row);
    const channelValues: Record<string, unknown> = {};
    for (const [channel, type, blob] of row.channel_values) {
      if (type === 'empty') continue;
      channelValues[channel] = await this.serde.loadsTyped(type, Buffer.from(blob ?? '', 'base64'));
    }
    const pendingWrites: CheckpointPendingWrite[] = [];
    for (const [taskId, channel, type, blob] of row.pending_writes) {
      pendingWrites.push([taskId, channel, await this.serde.loadsTyped(type, Buffer.from(blob, 'base64'))]);
    }
    const configurable = { thread_id: row.thread_id, checkpoint_ns: row.checkpoint_ns };
    return {
      config: { configurable: { ...configurable, checkpoint_id: row.checkpoint_id } },
      checkpoint: {
        ...row.checkpoint,
        channel_versions: row.checkpoint.channel_versions ?? {},
        versions_seen: row.checkpoint.versions_seen ?? {},
        channel_values: channelValues,
      } as Checkpoint,
      metadata: row.metadata,
      ...(row.parent_checkpoint_id ? { parentConfig: { configurable: { ...configurable, checkpoint_id: row.parent_checkpoint_id } } } : {}),
      pendingWrites,
    };
  }
}
