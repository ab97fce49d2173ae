// The suite's database: a new one on the server DATABASE_URL names (else an embedded
// PostgreSQL), migrated by the World itself on its first use; dropped at the end. The World
// under test reads DATABASE_URL, which the suite's servers inherit from this process.
import pg from 'pg';
import { startEmbeddedPostgres } from '../../../dist/dev/index.js';

let embedded;
let adminUrl;
const database = `runledger_workflow_world_${process.pid}`;

async function admin(sql) {
  const client = new pg.Client({ connectionString: adminUrl });
  await client.connect();
  try {
    await client.query(sql);
  } finally {
    await client.end();
  }
}

export async function setup() {
  if (process.env.DATABASE_URL) adminUrl = process.env.DATABASE_URL;
  else {
    embedded = await startEmbeddedPostgres({ dataDir: `../../../.runledger/workflow-world-pg-${process.pid}`, ephemeral: true });
    adminUrl = embedded.connectionString;
  }
  await admin(`drop database if exists ${database} with (force)`);
  await admin(`create database ${database}`);
  const url = new URL(adminUrl);
  url.pathname = `/${database}`;
  process.env.DATABASE_URL = url.toString();
}

export async function teardown() {
  await admin(`drop database if exists ${database} with (force)`);
  await embedded?.stop();
}
