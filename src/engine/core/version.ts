/** Recorded on every run at start: which runtime and checkpoint format it began with. */
export const RUNTIME_VERSION = '0.2.0';
export const CHECKPOINT_SCHEMA_VERSION = 1;
export const RUNTIME_MANIFEST = Object.freeze({ runtime: `runledger@${RUNTIME_VERSION}`, checkpointSchema: CHECKPOINT_SCHEMA_VERSION });
