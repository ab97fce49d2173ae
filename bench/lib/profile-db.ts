import pg from 'pg';
import { createDatabaseSql } from './db.js';

/** The environment a profile script reads, checked before anything is measured. */
export interface ProfileSettings {
  /** The server the profile creates its database on. */
  url: string;
  /** How many runs (or calls) to measure: N, or the script's default. */
  count: number;
  /** The server's postmaster on this machine (POSTMASTER_PID), for its CPU; else undefined. */
  postmaster: number | undefined;
}

/**
 * Reads DATABASE_URL, N and POSTMASTER_PID, refusing (with a message naming the variable)
 * a missing URL, an N that is not a positive whole number, or a PID that is not one: a
 * profile run on a wrong setting measures nothing and says so only by its odd figures.
 */
export function profileSettings(defaultCount: number): ProfileSettings {
  const url = process.env.DATABASE_URL;
  if (!url) throw new Error('DATABASE_URL is required (a server you may create databases on)');
  const count = positiveInteger('N', process.env.N, defaultCount);
  const postmaster = process.env.POSTMASTER_PID ? positiveInteger('POSTMASTER_PID', process.env.POSTMASTER_PID, 0) : undefined;
  return { url, count, postmaster };
}

/** The environment variable `name` as a positive whole number (`fallback` when unset); refuses anything else. */
export function positiveInteger(name: string, raw: string | undefined, fallback: number): number {
  if (raw === undefined || raw === '') return fallback;
  const value = Number(raw);
  if (!Number.isSafeInteger(value) || value <= 0) throw new Error(`${name} must be a positive whole number, got ${JSON.stringify(raw)}`);
  return value;
}

/**
 * Drops and recreates `database` on the server at `url` (closing its sessions), with
 * track_functions = 'pl' when TRACK_FUNCTIONS=1, and returns the URL that reaches it.
 */
export async function freshProfileDatabase(url: string, database: string): Promise<string> {
  const admin = new pg.Client({ connectionString: url });
  await admin.connect();
  try {
    await admin.query(`drop database if exists ${database} with (force)`);
    await admin.query(createDatabaseSql(database));
    if (process.env.TRACK_FUNCTIONS === '1') await admin.query(`alter database ${database} set track_functions = 'pl'`);
  } finally {
    await admin.end();
  }
  const dbUrl = new URL(url);
  dbUrl.pathname = `/${database}`;
  return dbUrl.toString();
}
