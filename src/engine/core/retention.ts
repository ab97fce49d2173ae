/**
 * The kinds of data runledger.retention keeps for a while (sql/0013_retention.sql,
 * docs/retention.md), in the order runledger.prune_due applies them.
 */
export const RETENTION_KINDS = ['idempotency', 'events', 'signals', 'streams', 'runs', 'session_entries', 'audit_log'] as const;
export type RetentionKind = (typeof RETENTION_KINDS)[number];

/** The kinds kept per workflow; session_entries and audit_log have only the default rule. */
export const PER_WORKFLOW_KINDS: readonly RetentionKind[] = ['idempotency', 'events', 'signals', 'streams', 'runs'];

/** The cluster-wide maintenance task's name in runledger.maintenance. */
export const RETENTION_TASK = 'retention';
