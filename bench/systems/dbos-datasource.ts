/**
 * A DBOS transactional data source on node-postgres, for the txstep workload.
 *
 * Why it exists: DBOS 5.x publishes no data source package on npm (knex-, drizzle-
 * and postgres-datasource stop at 4.x and import helpers that 5.x removed), so this
 * file implements the SDK's documented DataSourceTransactionHandler contract
 * (@dbos-inc/dbos-sdk/datasource) the way its own data sources do: look up the
 * step's completion row; BEGIN; the user's SQL; insert the completion row
 * (ON CONFLICT DO NOTHING); assertStillOwnsWorkflow; COMMIT. Only what the
 * benchmark needs: transactions that return nothing and do not throw.
 */
import { AsyncLocalStorage } from 'node:async_hooks';
import { DBOS } from '@dbos-inc/dbos-sdk';
import {
  DBOSStepAlreadyRecordedError,
  assertStillOwnsWorkflow,
  migrateDataSourcePG,
  registerDataSource,
  replayRecordedStep,
  runTransaction,
  type DataSourceTransactionHandler,
} from '@dbos-inc/dbos-sdk/datasource';
import pg from 'pg';

const current = new AsyncLocalStorage<pg.PoolClient>();

class PgTransactionHandler implements DataSourceTransactionHandler {
  readonly name: string;
  private pool: pg.Pool | undefined;
  constructor(
    name: string,
    private readonly poolConfig: pg.PoolConfig,
  ) {
    this.name = name;
  }

  async initialize(): Promise<void> {
    this.pool = new pg.Pool(this.poolConfig);
    const client = await this.pool.connect();
    try {
      await client.query('begin');
      await migrateDataSourcePG(async (text) => (await client.query(text)).rows);
      await client.query('commit');
    } catch (error) {
      await client.query('rollback').catch(() => undefined);
      throw error;
    } finally {
      client.release();
    }
  }

  async destroy(): Promise<void> {
    await this.pool?.end();
    this.pool = undefined;
  }

  async deleteCheckpoints(workflowID: string, startStep: number, beforeCommit?: () => Promise<void>): Promise<void> {
    const client = await this.pool!.connect();
    try {
      await client.query('begin');
      await client.query('delete from dbos.transaction_completion where workflow_id = $1 and function_num >= $2', [workflowID, startStep]);
      await beforeCommit?.();
      await client.query('commit');
    } catch (error) {
      await client.query('rollback').catch(() => undefined);
      throw error;
    } finally {
      client.release();
    }
  }

  async invokeTransactionFunction<This, Args extends unknown[], Return>(
    _config: unknown,
    target: This,
    func: (this: This, ...args: Args) => Promise<Return>,
    ...args: Args
  ): Promise<Return> {
    const workflowID = DBOS.workflowID;
    const stepID = DBOS.stepID;
    const pool = this.pool!;
    if (workflowID !== undefined && stepID !== undefined) {
      const done = await pool.query('select output, error from dbos.transaction_completion where workflow_id = $1 and function_num = $2', [
        workflowID,
        stepID,
      ]);
      if (done.rows.length > 0) return replayRecordedStep<Return>(done.rows[0]);
    }
    const client = await pool.connect();
    try {
      await client.query('begin');
      const result = await current.run(client, () => func.call(target, ...args));
      if (result !== undefined && result !== null) throw new Error('bench data source: transactions must return nothing');
      if (workflowID !== undefined && stepID !== undefined) {
        const inserted = await client.query(
          `insert into dbos.transaction_completion (workflow_id, function_num, output, error) values ($1, $2, null, null)
           on conflict (workflow_id, function_num) do nothing returning workflow_id`,
          [workflowID, stepID],
        );
        if (inserted.rows.length === 0) throw new DBOSStepAlreadyRecordedError(workflowID, stepID);
        await assertStillOwnsWorkflow(workflowID);
      }
      await client.query('commit');
      return result;
    } catch (error) {
      await client.query('rollback').catch(() => undefined);
      if (error instanceof DBOSStepAlreadyRecordedError && workflowID !== undefined) {
        const done = await pool.query(
          'select output, error from dbos.transaction_completion where workflow_id = $1 and function_num = $2',
          [workflowID, stepID],
        );
        return replayRecordedStep<Return>(done.rows[0]);
      }
      throw error;
    } finally {
      client.release();
    }
  }
}

export class PgDataSource {
  constructor(
    readonly name: string,
    poolConfig: pg.PoolConfig,
  ) {
    registerDataSource(new PgTransactionHandler(name, poolConfig));
  }
  /** The transaction's client, inside runTransaction only. */
  static get client(): pg.PoolClient {
    const client = current.getStore();
    if (!client) throw new Error('PgDataSource.client used outside a transaction');
    return client;
  }
  runTransaction<T>(fn: () => Promise<T>, name: string): Promise<T> {
    return runTransaction(fn, name, { dsName: this.name });
  }
}
