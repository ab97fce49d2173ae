-- GENERATED FILE, do not edit. The net schema `runledger` after every migration in
-- sql/NNNN_*.sql, read from the catalog (test/schema/snapshot.ts). Regenerate with
--   npm run schema:snapshot
-- and commit it with the migration that changes it; test/schema-snapshot.test.ts fails
-- while it differs from a freshly migrated database.

CREATE SCHEMA runledger;
COMMENT ON SCHEMA runledger IS 'runledger: durable queue-and-workflow engine. Read the tables and views; change state through the functions (\df runledger.*).';

-- types

CREATE TYPE runledger.run_status AS ENUM ('PENDING', 'RUNNING', 'WAITING', 'CANCELLING', 'SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER');
COMMENT ON TYPE runledger.run_status IS 'Run state machine. Terminal: SUCCEEDED, FAILED, CANCELLED, TERMINATED, DEAD_LETTER. See docs/state-machine.md.';

-- sequences

CREATE SEQUENCE runledger.audit_log_audit_id_seq AS bigint START 1 INCREMENT 1 MINVALUE 1 MAXVALUE 9223372036854775807 CACHE 1 OWNED BY runledger.audit_log.audit_id (identity);

CREATE SEQUENCE runledger.events_event_id_seq AS bigint START 1 INCREMENT 1 MINVALUE 1 MAXVALUE 9223372036854775807 CACHE 1 OWNED BY runledger.events.event_id (identity);

CREATE SEQUENCE runledger.session_waiters_ticket_seq AS bigint START 1 INCREMENT 1 MINVALUE 1 MAXVALUE 9223372036854775807 CACHE 1 OWNED BY runledger.session_waiters.ticket (identity);

CREATE SEQUENCE runledger.wf_stream_chunks_seq_seq AS bigint START 1 INCREMENT 1 MINVALUE 1 MAXVALUE 9223372036854775807 CACHE 1 OWNED BY runledger.wf_stream_chunks.seq (identity);

-- tables

CREATE TABLE runledger.admissions (
  queue_name text COLLATE "C" NOT NULL,
  admitted_at timestamp with time zone NOT NULL
);
COMMENT ON TABLE runledger.admissions IS 'Admission times of rate-limited queues, kept for one rate-limit period: the sliding window the limit is counted over.';
CREATE INDEX admissions_window ON runledger.admissions USING btree (queue_name, admitted_at);

CREATE TABLE runledger.approval_votes (
  request_id text COLLATE "C" NOT NULL,
  voter text COLLATE "C" NOT NULL,
  approved boolean NOT NULL,
  note text COLLATE "C",
  db_user text COLLATE "C" DEFAULT SESSION_USER NOT NULL,
  db_role text COLLATE "C" DEFAULT runledger._caller() NOT NULL,
  decided_at timestamp with time zone DEFAULT runledger.now() NOT NULL
);
COMMENT ON TABLE runledger.approval_votes IS 'Each decision on an approval request that needs more than one (approvals.required > 1): who (voter: the name given, or the login for a role approver), approve or reject, note, login and role, when. The request is decided when required approvals are in, or at the first rejection.';
ALTER TABLE runledger.approval_votes ADD CONSTRAINT approval_votes_pkey PRIMARY KEY (request_id, voter);
ALTER TABLE runledger.approval_votes ADD CONSTRAINT approval_votes_request_id_fkey FOREIGN KEY (request_id) REFERENCES runledger.approvals(request_id) ON DELETE CASCADE;
CREATE UNIQUE INDEX approval_votes_pkey ON runledger.approval_votes USING btree (request_id, voter);

CREATE TABLE runledger.approvals (
  request_id text COLLATE "C" NOT NULL,
  run_id text COLLATE "C" NOT NULL,
  seq integer NOT NULL,
  name text COLLATE "C" NOT NULL,
  action text COLLATE "C" NOT NULL,
  evidence jsonb,
  approvers text[] COLLATE "C",
  required integer DEFAULT 1 NOT NULL,
  requested_at timestamp with time zone DEFAULT runledger.now() NOT NULL,
  expires_at timestamp with time zone,
  decision boolean,
  decided_by text COLLATE "C",
  decided_db_user text COLLATE "C",
  decided_db_role text COLLATE "C",
  decided_at timestamp with time zone,
  note text COLLATE "C"
);
COMMENT ON TABLE runledger.approvals IS 'Human approval requests: what is asked (action, evidence), who may decide (approvers; null = anyone), until when, and the decision kept as audit evidence (who by the name given, decided_db_user and decided_db_role as the database knows them, when, note).';
ALTER TABLE runledger.approvals ADD CONSTRAINT approvals_decision_complete CHECK (((decision IS NULL) = ((decided_at IS NULL) AND (decided_by IS NULL))));
ALTER TABLE runledger.approvals ADD CONSTRAINT approvals_pkey PRIMARY KEY (request_id);
ALTER TABLE runledger.approvals ADD CONSTRAINT approvals_required_check CHECK ((required >= 1));
ALTER TABLE runledger.approvals ADD CONSTRAINT approvals_run_id_fkey FOREIGN KEY (run_id) REFERENCES runledger.runs(run_id) ON DELETE CASCADE;
ALTER TABLE runledger.approvals ADD CONSTRAINT approvals_run_id_seq_key UNIQUE (run_id, seq);
CREATE UNIQUE INDEX approvals_pkey ON runledger.approvals USING btree (request_id);
CREATE UNIQUE INDEX approvals_run_id_seq_key ON runledger.approvals USING btree (run_id, seq);

CREATE TABLE runledger.artifact_blobs (
  sha256 text COLLATE "C" NOT NULL,
  size bigint NOT NULL,
  content bytea NOT NULL,
  created_at timestamp with time zone DEFAULT runledger.now() NOT NULL
);
COMMENT ON TABLE runledger.artifact_blobs IS 'Artifact content, stored once by its sha256 (hex) however many artifacts, runs or checkpoints refer to it. Read one with select convert_from(content, ''UTF8'') from runledger.artifact_blobs where sha256 = ...';
ALTER TABLE runledger.artifact_blobs ADD CONSTRAINT artifact_blobs_pkey PRIMARY KEY (sha256);
ALTER TABLE runledger.artifact_blobs ADD CONSTRAINT artifact_blobs_sha256 CHECK ((sha256 ~ '^[0-9a-f]{64}$'::text));
ALTER TABLE runledger.artifact_blobs ADD CONSTRAINT artifact_blobs_size CHECK ((size = octet_length(content)));
CREATE UNIQUE INDEX artifact_blobs_pkey ON runledger.artifact_blobs USING btree (sha256);

CREATE TABLE runledger.artifacts (
  artifact_id text COLLATE "C" NOT NULL,
  run_id text COLLATE "C" NOT NULL,
  name text COLLATE "C" NOT NULL,
  kind text COLLATE "C" NOT NULL,
  sha256 text COLLATE "C",
  size bigint,
  blob text COLLATE "C",
  ref text COLLATE "C",
  step_position integer,
  created_at timestamp with time zone DEFAULT runledger.now() NOT NULL
);
COMMENT ON TABLE runledger.artifacts IS 'What runs produced: kind artifact (ctx.artifact, recorded with its step''s checkpoint, once per run and step position) or value (a large step result stored by reference, once per run and content). Content is in artifact_blobs (blob = sha256) or elsewhere (ref).';
ALTER TABLE runledger.artifacts ADD CONSTRAINT artifacts_blob_fkey FOREIGN KEY (blob) REFERENCES runledger.artifact_blobs(sha256);
ALTER TABLE runledger.artifacts ADD CONSTRAINT artifacts_content_or_ref CHECK ((((blob IS NULL) = (ref IS NOT NULL)) AND ((blob IS NULL) OR (blob = sha256))));
ALTER TABLE runledger.artifacts ADD CONSTRAINT artifacts_kind CHECK ((kind = ANY (ARRAY['artifact'::text, 'value'::text])));
ALTER TABLE runledger.artifacts ADD CONSTRAINT artifacts_name CHECK (((length(name) >= 1) AND (length(name) <= 200)));
ALTER TABLE runledger.artifacts ADD CONSTRAINT artifacts_pkey PRIMARY KEY (artifact_id);
ALTER TABLE runledger.artifacts ADD CONSTRAINT artifacts_ref CHECK (((ref IS NULL) OR ((length(ref) >= 1) AND (length(ref) <= 2000))));
ALTER TABLE runledger.artifacts ADD CONSTRAINT artifacts_run_id_fkey FOREIGN KEY (run_id) REFERENCES runledger.runs(run_id) ON DELETE CASCADE;
ALTER TABLE runledger.artifacts ADD CONSTRAINT artifacts_sha256 CHECK (((sha256 IS NULL) OR (sha256 ~ '^[0-9a-f]{64}$'::text)));
ALTER TABLE runledger.artifacts ADD CONSTRAINT artifacts_size CHECK (((size IS NULL) OR (size >= 0)));
CREATE INDEX artifacts_blob ON runledger.artifacts USING btree (blob) WHERE (blob IS NOT NULL);
CREATE UNIQUE INDEX artifacts_pkey ON runledger.artifacts USING btree (artifact_id);
CREATE INDEX artifacts_run ON runledger.artifacts USING btree (run_id);
CREATE UNIQUE INDEX artifacts_step ON runledger.artifacts USING btree (run_id, step_position) WHERE (kind = 'artifact'::text);
CREATE UNIQUE INDEX artifacts_value ON runledger.artifacts USING btree (run_id, blob) WHERE (kind = 'value'::text);

CREATE TABLE runledger.audit_log (
  audit_id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
  at timestamp with time zone DEFAULT runledger.now() NOT NULL,
  db_user text COLLATE "C" DEFAULT SESSION_USER NOT NULL,
  db_role text COLLATE "C" DEFAULT runledger._caller() NOT NULL,
  asserted_by text COLLATE "C",
  action text COLLATE "C" NOT NULL,
  run_id text COLLATE "C",
  target text COLLATE "C",
  arguments jsonb DEFAULT '{}'::jsonb NOT NULL,
  result jsonb
);
COMMENT ON TABLE runledger.audit_log IS 'One row per operator action (send_signal, decide_approval, cancel_run, compensate_run, retry_run, resolve_operation, fork_run, migrate_run, migrate_runs, set_queue, prune, release_session, delete_session, prune_artifact_blobs; and prune_due, set_retention, clear_retention (0013_retention.sql), and owner_settings, a change of runledger.owner_settings by the schema''s owner), written in the same transaction as the action: who (db_user = session_user, db_role = runledger._caller(), asserted_by = the name the caller gave), what, on which run and target, with which arguments, and what it returned. Kept when runs are pruned; the audit_log retention rule never removes a record younger than owner_settings.audit_log_min_keep, nor one of set_retention, clear_retention or owner_settings.';
ALTER TABLE runledger.audit_log ADD CONSTRAINT audit_log_pkey PRIMARY KEY (audit_id);
CREATE INDEX audit_log_at ON runledger.audit_log USING btree (at);
CREATE UNIQUE INDEX audit_log_pkey ON runledger.audit_log USING btree (audit_id);
CREATE INDEX audit_log_run ON runledger.audit_log USING btree (run_id, audit_id) WHERE (run_id IS NOT NULL);

CREATE TABLE runledger.environments (
  env_id text COLLATE "C" NOT NULL,
  run_id text COLLATE "C" NOT NULL,
  workflow_name text COLLATE "C" NOT NULL,
  workflow_version text COLLATE "C" NOT NULL,
  manifest jsonb NOT NULL,
  seq integer NOT NULL,
  attempt integer NOT NULL,
  created_at timestamp with time zone DEFAULT runledger.now() NOT NULL,
  reclaim_owner text COLLATE "C",
  reclaim_until timestamp with time zone,
  reclaim_attempts integer DEFAULT 0 NOT NULL,
  reclaimed_at timestamp with time zone,
  reclaimed_status text COLLATE "C",
  last_error jsonb
);
COMMENT ON TABLE runledger.environments IS 'Execution environments of runs (engine.workflow({ environment })): the manifest each attempt of the create step made, the worker reclaiming it (reclaim_owner until reclaim_until), and the last reclaim: when, for which run status, how many attempts, the last error. Reclaimed once the run finishes, whatever its status; again after a retry_run when the run finishes again.';
ALTER TABLE runledger.environments ADD CONSTRAINT environments_pkey PRIMARY KEY (env_id);
ALTER TABLE runledger.environments ADD CONSTRAINT environments_run_id_fkey FOREIGN KEY (run_id) REFERENCES runledger.runs(run_id) ON DELETE CASCADE;
CREATE UNIQUE INDEX environments_pkey ON runledger.environments USING btree (env_id);
CREATE INDEX environments_run ON runledger.environments USING btree (run_id);
CREATE INDEX environments_unreclaimed ON runledger.environments USING btree (workflow_name, workflow_version) WHERE (reclaimed_at IS NULL);

CREATE TABLE runledger.events (
  event_id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
  run_id text COLLATE "C" NOT NULL,
  at timestamp with time zone DEFAULT runledger.now() NOT NULL,
  kind text COLLATE "C" NOT NULL,
  detail jsonb,
  fencing_token bigint
);
COMMENT ON TABLE runledger.events IS 'Append-only history of each run (created, claimed, lease_expired, recovered, completed, failed, dead_lettered, retried, released, ...), written in the same transaction as the change it records.';
ALTER TABLE runledger.events ADD CONSTRAINT events_pkey PRIMARY KEY (run_id, event_id);
COMMENT ON CONSTRAINT events_pkey ON runledger.events IS 'The key of an event is its run and its place in that run''s history (event_id, an identity, increases with time): a run''s history is read, deleted and pruned by run.';
CREATE UNIQUE INDEX events_pkey ON runledger.events USING btree (run_id, event_id);

CREATE TABLE runledger.graph_blobs (
  thread_id text COLLATE "C" NOT NULL,
  checkpoint_ns text COLLATE "C" DEFAULT ''::text NOT NULL,
  channel text COLLATE "C" NOT NULL,
  version text COLLATE "C" NOT NULL,
  type text COLLATE "C" NOT NULL,
  blob bytea
);
COMMENT ON TABLE runledger.graph_blobs IS 'The value of a LangGraph channel at one version, stored once and shared by every checkpoint of the thread that names that version.';
ALTER TABLE runledger.graph_blobs ADD CONSTRAINT graph_blobs_pkey PRIMARY KEY (thread_id, checkpoint_ns, channel, version);
CREATE UNIQUE INDEX graph_blobs_pkey ON runledger.graph_blobs USING btree (thread_id, checkpoint_ns, channel, version);

CREATE TABLE runledger.graph_checkpoints (
  thread_id text COLLATE "C" NOT NULL,
  checkpoint_ns text COLLATE "C" DEFAULT ''::text NOT NULL,
  checkpoint_id text COLLATE "C" NOT NULL,
  parent_checkpoint_id text COLLATE "C",
  checkpoint jsonb NOT NULL,
  metadata jsonb DEFAULT '{}'::jsonb NOT NULL,
  run_id text COLLATE "C",
  created_at timestamp with time zone DEFAULT runledger.now() NOT NULL
);
COMMENT ON TABLE runledger.graph_checkpoints IS 'LangGraph checkpoints written by runledger/langgraph''s RunledgerSaver: one row per checkpoint of a thread (and namespace: '''' for the graph, a path for a subgraph), newest last by checkpoint_id (ids sort by time), with the run that wrote it under runGraph.';
ALTER TABLE runledger.graph_checkpoints ADD CONSTRAINT graph_checkpoints_pkey PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id);
CREATE UNIQUE INDEX graph_checkpoints_pkey ON runledger.graph_checkpoints USING btree (thread_id, checkpoint_ns, checkpoint_id);

CREATE TABLE runledger.graph_writes (
  thread_id text COLLATE "C" NOT NULL,
  checkpoint_ns text COLLATE "C" DEFAULT ''::text NOT NULL,
  checkpoint_id text COLLATE "C" NOT NULL,
  task_id text COLLATE "C" NOT NULL,
  idx integer NOT NULL,
  channel text COLLATE "C" NOT NULL,
  type text COLLATE "C",
  blob bytea NOT NULL,
  task_path text COLLATE "C" DEFAULT ''::text NOT NULL
);
COMMENT ON TABLE runledger.graph_writes IS 'Pending writes of LangGraph tasks after a checkpoint (a node''s output, an interrupt, an error): a task whose writes are here is not run again when the thread resumes from that checkpoint.';
ALTER TABLE runledger.graph_writes ADD CONSTRAINT graph_writes_pkey PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx);
CREATE UNIQUE INDEX graph_writes_pkey ON runledger.graph_writes USING btree (thread_id, checkpoint_ns, checkpoint_id, task_id, idx);

CREATE TABLE runledger.maintenance (
  task text COLLATE "C" NOT NULL,
  worker_id text COLLATE "C",
  started_at timestamp with time zone,
  lease_until timestamp with time zone,
  finished_at timestamp with time zone,
  last_result jsonb
);
COMMENT ON TABLE runledger.maintenance IS 'Cluster-wide maintenance tasks (retention): which worker runs one now (lease_until in the future) or ran it last, when it started and finished, and what it did. A task runs on one worker at a time, once per interval across the cluster (runledger._maintenance_begin).';
ALTER TABLE runledger.maintenance ADD CONSTRAINT maintenance_pkey PRIMARY KEY (task);
CREATE UNIQUE INDEX maintenance_pkey ON runledger.maintenance USING btree (task);

CREATE TABLE runledger.migrations (
  version integer NOT NULL,
  name text COLLATE "C" NOT NULL,
  breaking boolean DEFAULT false NOT NULL,
  applied_at timestamp with time zone DEFAULT now() NOT NULL,
  checksum text COLLATE "C"
);
COMMENT ON TABLE runledger.migrations IS 'Applied runledger migrations (files sql/NNNN_*.sql). A breaking migration newer than the code makes older code refuse to start.';
COMMENT ON COLUMN runledger.migrations.checksum IS 'sha256 (hex) of the file''s text as applied, recorded by migrate(); migrate() refuses a database whose applied files differ from its own (null: applied with psql, taken as the running build''s).';
ALTER TABLE runledger.migrations ADD CONSTRAINT migrations_pkey PRIMARY KEY (version);
CREATE UNIQUE INDEX migrations_pkey ON runledger.migrations USING btree (version);

CREATE TABLE runledger.operations (
  operation_id text COLLATE "C" NOT NULL,
  run_id text COLLATE "C" NOT NULL,
  seq integer NOT NULL,
  name text COLLATE "C" NOT NULL,
  idempotency_key text COLLATE "C" NOT NULL,
  status text COLLATE "C" NOT NULL,
  external_resource_id text COLLATE "C",
  result jsonb,
  error jsonb,
  attempts integer DEFAULT 1 NOT NULL,
  compensable boolean DEFAULT false NOT NULL,
  compensation_status text COLLATE "C",
  compensation_error jsonb,
  started_at timestamp with time zone DEFAULT runledger.now() NOT NULL,
  updated_at timestamp with time zone DEFAULT runledger.now() NOT NULL,
  finished_at timestamp with time zone,
  resolved_by text COLLATE "C",
  prior_operation_id text COLLATE "C"
);
COMMENT ON TABLE runledger.operations IS 'Operation ledger: one row per external side effect (ctx.operation). STARTED (with its idempotency key) commits before the call; SUCCEEDED or FAILED commits with the step checkpoint; a STARTED row found on replay is UNKNOWN until reconcile, an idempotent retry or an operator (resolve_operation) settles it. An idempotency key is unique, except in the forks of the run that used it (prior_operation_id); retry_run puts a FAILED one back to PLANNED (attempts 0), to be called again with the same key.';
COMMENT ON COLUMN runledger.operations.prior_operation_id IS 'In a fork (fork_run): the operation of an ancestor run with the same idempotency key. The fork reused its result (status SUCCEEDED, attempts 0, event operation_reused) or, when it had not succeeded, made a new attempt under the same key (event operation_attempted_by_fork on the ancestor).';
ALTER TABLE runledger.operations ADD CONSTRAINT operations_compensation_status_check CHECK ((compensation_status = ANY (ARRAY['STARTED'::text, 'DONE'::text, 'FAILED'::text])));
ALTER TABLE runledger.operations ADD CONSTRAINT operations_pkey PRIMARY KEY (operation_id);
ALTER TABLE runledger.operations ADD CONSTRAINT operations_run_id_fkey FOREIGN KEY (run_id) REFERENCES runledger.runs(run_id) ON DELETE CASCADE;
ALTER TABLE runledger.operations ADD CONSTRAINT operations_run_id_seq_key UNIQUE (run_id, seq);
ALTER TABLE runledger.operations ADD CONSTRAINT operations_status_check CHECK ((status = ANY (ARRAY['PLANNED'::text, 'STARTED'::text, 'SUCCEEDED'::text, 'FAILED'::text, 'UNKNOWN'::text])));
CREATE UNIQUE INDEX operations_idempotency_key ON runledger.operations USING btree (idempotency_key) WHERE (prior_operation_id IS NULL);
CREATE UNIQUE INDEX operations_pkey ON runledger.operations USING btree (operation_id);
CREATE UNIQUE INDEX operations_run_id_seq_key ON runledger.operations USING btree (run_id, seq);
CREATE INDEX operations_unknown ON runledger.operations USING btree (updated_at) WHERE (status = 'UNKNOWN'::text);

CREATE TABLE runledger.owner_settings (
  one boolean DEFAULT true NOT NULL,
  audit_log_min_keep interval DEFAULT '365 days'::interval NOT NULL,
  test_clock boolean DEFAULT false NOT NULL
);
COMMENT ON TABLE runledger.owner_settings IS 'Settings only the schema''s owner changes (with UPDATE; no runledger role may write a table, and no function writes this one), one row: audit_log_min_keep, the floor under the audit_log retention rule (default 365 days: set_retention refuses a shorter one with 42501, and prune_due never removes a younger record); test_clock. Every change is recorded in audit_log (action owner_settings), and those records are never pruned.';
COMMENT ON COLUMN runledger.owner_settings.test_clock IS 'The test clock: while true, runledger.now() honours the session settings runledger.fake_now and runledger.clock_offset of every session; while false (the default), it is the database''s clock whatever a session sets. For test databases only (runledger/testing switches it on in the ones it makes).';
ALTER TABLE runledger.owner_settings ADD CONSTRAINT owner_settings_audit_log_min_keep CHECK ((audit_log_min_keep >= '00:00:00'::interval));
ALTER TABLE runledger.owner_settings ADD CONSTRAINT owner_settings_one CHECK (one);
ALTER TABLE runledger.owner_settings ADD CONSTRAINT owner_settings_pkey PRIMARY KEY (one);
CREATE UNIQUE INDEX owner_settings_pkey ON runledger.owner_settings USING btree (one);
CREATE TRIGGER owner_settings_audit AFTER INSERT OR DELETE OR UPDATE ON runledger.owner_settings FOR EACH ROW EXECUTE FUNCTION runledger._owner_settings_changed();
COMMENT ON TRIGGER owner_settings_audit ON runledger.owner_settings IS 'Every change of the owner''s settings is recorded in audit_log (runledger._owner_settings_changed).';

CREATE TABLE runledger.queues (
  name text COLLATE "C" NOT NULL,
  concurrency integer,
  per_key_concurrency integer,
  rate_limit_max integer,
  rate_limit_period_ms integer,
  paused boolean DEFAULT false NOT NULL,
  updated_at timestamp with time zone DEFAULT runledger.now() NOT NULL
);
COMMENT ON TABLE runledger.queues IS 'Queue limits, enforced by admission in SQL across all workers: concurrency (runs RUNNING at once), per_key_concurrency (per concurrency_key, e.g. a tenant), rate limit (admissions per period), paused. Change with runledger.set_queue.';
ALTER TABLE runledger.queues ADD CONSTRAINT queues_concurrency_check CHECK ((concurrency > 0));
ALTER TABLE runledger.queues ADD CONSTRAINT queues_name_check CHECK ((name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$'::text));
ALTER TABLE runledger.queues ADD CONSTRAINT queues_per_key_concurrency_check CHECK ((per_key_concurrency > 0));
ALTER TABLE runledger.queues ADD CONSTRAINT queues_pkey PRIMARY KEY (name);
ALTER TABLE runledger.queues ADD CONSTRAINT queues_rate_limit_complete CHECK (((rate_limit_max IS NULL) = (rate_limit_period_ms IS NULL)));
ALTER TABLE runledger.queues ADD CONSTRAINT queues_rate_limit_max_check CHECK ((rate_limit_max > 0));
ALTER TABLE runledger.queues ADD CONSTRAINT queues_rate_limit_period_ms_check CHECK ((rate_limit_period_ms > 0));
CREATE UNIQUE INDEX queues_pkey ON runledger.queues USING btree (name);

CREATE TABLE runledger.rate_limit_calls (
  key text COLLATE "C" NOT NULL,
  at timestamp with time zone NOT NULL,
  run_id text COLLATE "C" NOT NULL,
  seq integer NOT NULL
);
COMMENT ON TABLE runledger.rate_limit_calls IS 'The calls let through on each limited key within its last window (older ones are deleted as new ones come): when, and by which run and step position.';
ALTER TABLE runledger.rate_limit_calls ADD CONSTRAINT rate_limit_calls_key_fkey FOREIGN KEY (key) REFERENCES runledger.rate_limit_keys(key) ON DELETE CASCADE;
CREATE INDEX rate_limit_calls_key_at ON runledger.rate_limit_calls USING btree (key, at);

CREATE TABLE runledger.rate_limit_keys (
  key text COLLATE "C" NOT NULL,
  max_calls integer,
  per interval,
  paused_until timestamp with time zone,
  pause_reason jsonb,
  updated_at timestamp with time zone DEFAULT runledger.now() NOT NULL
);
COMMENT ON TABLE runledger.rate_limit_keys IS 'Shared rate limits (set_rate_limit): at most max_calls calls in any window of length per for every step, operation, tool or model call that names the key, across every run and worker; paused_until (pause_rate_limit, or a call that failed with Retry-After) lets no call through before it. max_calls null: the key only carries pauses.';
ALTER TABLE runledger.rate_limit_keys ADD CONSTRAINT rate_limit_keys_check CHECK (((max_calls IS NULL) = (per IS NULL)));
ALTER TABLE runledger.rate_limit_keys ADD CONSTRAINT rate_limit_keys_key_check CHECK ((key ~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,99}$'::text));
ALTER TABLE runledger.rate_limit_keys ADD CONSTRAINT rate_limit_keys_max_calls_check CHECK (((max_calls >= 1) AND (max_calls <= 1000000)));
ALTER TABLE runledger.rate_limit_keys ADD CONSTRAINT rate_limit_keys_per_check CHECK (((per > '00:00:00'::interval) AND (per <= '1 day'::interval)));
ALTER TABLE runledger.rate_limit_keys ADD CONSTRAINT rate_limit_keys_pkey PRIMARY KEY (key);
CREATE UNIQUE INDEX rate_limit_keys_pkey ON runledger.rate_limit_keys USING btree (key);

CREATE TABLE runledger.rate_limit_waiters (
  run_id text COLLATE "C" NOT NULL,
  seq integer NOT NULL,
  key text COLLATE "C" NOT NULL,
  since timestamp with time zone DEFAULT runledger.now() NOT NULL,
  until timestamp with time zone NOT NULL
);
COMMENT ON TABLE runledger.rate_limit_waiters IS 'Step positions refused a permit and waiting for one (in a worker''s memory, or as a WAITING run with wait_kind rate_limit): which key, since when, until when. The row goes when the permit is given, or when a caller of the key finds its run ended or gone; until then the view rate_limits does not count it.';
ALTER TABLE runledger.rate_limit_waiters ADD CONSTRAINT rate_limit_waiters_pkey PRIMARY KEY (run_id, seq);
CREATE INDEX rate_limit_waiters_key ON runledger.rate_limit_waiters USING btree (key);
CREATE UNIQUE INDEX rate_limit_waiters_pkey ON runledger.rate_limit_waiters USING btree (run_id, seq);

CREATE TABLE runledger.retention (
  kind text COLLATE "C" NOT NULL,
  workflow_name text COLLATE "C",
  keep interval,
  updated_at timestamp with time zone DEFAULT runledger.now() NOT NULL
);
COMMENT ON TABLE runledger.retention IS 'How long each kind of finished data is kept (runs, events, idempotency, signals, streams, session_entries, audit_log), per workflow (workflow_name null = the default for workflows without their own rule; session_entries and audit_log have only the default). keep null = forever; no row = forever (idempotency: the key lives as long as its run). Applied by runledger.prune_due(), which workers call on their own (retentionIntervalMs). See docs/retention.md.';
ALTER TABLE runledger.retention ADD CONSTRAINT retention_keep CHECK (((keep IS NULL) OR (keep >= '00:00:00'::interval)));
ALTER TABLE runledger.retention ADD CONSTRAINT retention_kind CHECK ((kind = ANY (ARRAY['runs'::text, 'events'::text, 'idempotency'::text, 'signals'::text, 'streams'::text, 'session_entries'::text, 'audit_log'::text])));
ALTER TABLE runledger.retention ADD CONSTRAINT retention_per_workflow CHECK (((workflow_name IS NULL) OR (kind = ANY (ARRAY['runs'::text, 'events'::text, 'idempotency'::text, 'signals'::text, 'streams'::text]))));
CREATE UNIQUE INDEX retention_rule ON runledger.retention USING btree (kind, COALESCE(workflow_name, ''::text));

CREATE TABLE runledger.role_functions (
  role_name text COLLATE "C" NOT NULL,
  function_name text COLLATE "C" NOT NULL
);
COMMENT ON TABLE runledger.role_functions IS 'Which runledger functions (every overload of the name) each role may execute. runledger.grant_roles() grants exactly these; a function listed here is SECURITY DEFINER with a fixed search_path. Reads of tables (worker, operator) and views (all three) are granted by grant_roles() too.';
ALTER TABLE runledger.role_functions ADD CONSTRAINT role_functions_pkey PRIMARY KEY (role_name, function_name);
ALTER TABLE runledger.role_functions ADD CONSTRAINT role_functions_role_name_check CHECK ((role_name = ANY (ARRAY['runledger_worker'::text, 'runledger_operator'::text, 'runledger_reader'::text])));
CREATE UNIQUE INDEX role_functions_pkey ON runledger.role_functions USING btree (role_name, function_name);

CREATE TABLE runledger.runs (
  run_id text COLLATE "C" NOT NULL,
  workflow_name text COLLATE "C" NOT NULL,
  workflow_version text COLLATE "C" NOT NULL,
  queue_name text COLLATE "C" NOT NULL,
  status runledger.run_status DEFAULT 'PENDING'::runledger.run_status NOT NULL,
  input jsonb,
  output jsonb,
  error jsonb,
  priority integer DEFAULT 0 NOT NULL,
  concurrency_key text COLLATE "C",
  idempotency_key text COLLATE "C",
  tenant_id text COLLATE "C",
  parent_run_id text COLLATE "C",
  created_at timestamp with time zone DEFAULT runledger.now() NOT NULL,
  updated_at timestamp with time zone DEFAULT runledger.now() NOT NULL,
  started_at timestamp with time zone,
  finished_at timestamp with time zone,
  deadline_at timestamp with time zone,
  wake_at timestamp with time zone,
  wait_kind text COLLATE "C",
  wait_key text COLLATE "C",
  lease_owner text COLLATE "C",
  lease_expires_at timestamp with time zone,
  fencing_token bigint DEFAULT 0 NOT NULL,
  recovery_attempts integer DEFAULT 0 NOT NULL,
  max_recovery_attempts integer DEFAULT 10 NOT NULL,
  version_manifest jsonb DEFAULT '{}'::jsonb NOT NULL,
  migrate_to text COLLATE "C",
  max_steps integer,
  budget numeric,
  budget_spent numeric DEFAULT 0 NOT NULL,
  budget_limits jsonb,
  budget_used jsonb,
  no_progress integer,
  cancel_requested_at timestamp with time zone,
  admitted boolean DEFAULT false NOT NULL,
  admitted_at timestamp with time zone,
  not_before timestamp with time zone,
  retry_budget integer,
  retries_used integer DEFAULT 0 NOT NULL,
  cancel_reason text COLLATE "C",
  termination_reason text COLLATE "C",
  termination_evidence jsonb,
  terminated_at timestamp with time zone,
  policy_version text COLLATE "C",
  stop_record jsonb,
  traceparent text COLLATE "C",
  execution_traceparent text COLLATE "C",
  in_sessions boolean,
  lineage_id text COLLATE "C",
  debounce_key text COLLATE "C"
);
COMMENT ON TABLE runledger.runs IS 'One row per workflow run: status, lease (owner, expiry, fencing token), recovery attempts and the termination record (reason, evidence, time, policy version).';
COMMENT ON COLUMN runledger.runs.wait_key IS 'What a WAITING run waits for: the signal topic, the approval request id or the child run id (null for timers).';
COMMENT ON COLUMN runledger.runs.fencing_token IS 'Incremented on every claim. Every checkpoint write checks it in the same transaction, so a worker that lost its lease cannot commit.';
COMMENT ON COLUMN runledger.runs.recovery_attempts IS 'How many times the run was recovered after its lease expired (its worker died or stalled). Past max_recovery_attempts the run is dead-lettered.';
COMMENT ON COLUMN runledger.runs.migrate_to IS 'Set by migrate_run: the version of its workflow this run is to continue on. A live worker with a migration for the pair applies it (runledger._apply_migration) and clears it; a failed migration clears it and leaves the run as it was (events migrated, migration_failed).';
COMMENT ON COLUMN runledger.runs.budget IS 'Budget in units charged by steps (ctx.charge: tokens, money...); budget_spent past it ends the run TERMINATED with reason BUDGET, atomically with the checkpoint that spent it.';
COMMENT ON COLUMN runledger.runs.budget_limits IS 'Budgets besides units, as {"tokens": n, "cost_usd": n, "tool_calls": n, "turns": n} (limits.budget given as an object); budget_used holds what was spent per dimension. Spending past any of them ends the run TERMINATED (BUDGET) with that dimension in the evidence, atomically with the write that spent it.';
COMMENT ON COLUMN runledger.runs.no_progress IS 'N: the same step name returning the same result (hash) N times in a row ends the run TERMINATED with reason NO_PROGRESS.';
COMMENT ON COLUMN runledger.runs.termination_reason IS 'Why a terminal run stopped: COMPLETED, FAILED, CANCELLED, DEADLINE, MAX_STEPS, BUDGET, NO_PROGRESS, MAX_RECOVERY_ATTEMPTS, NON_DETERMINISM, UNVERIFIED (the workflow''s verify refused its output).';
COMMENT ON COLUMN runledger.runs.stop_record IS 'Only on a CANCELLING run: the terminal record it ends with once its compensations have run, {status, reason, evidence, error} (a policy stop such as DEADLINE or BUDGET, or the record compensate_run set aside); null for a plain cancel, which ends CANCELLED.';
COMMENT ON COLUMN runledger.runs.traceparent IS 'The W3C traceparent (00-<trace id>-<span id>-<flags>) of the context the run was started in (engine.start, or the traceparent option of start_run / start_runs); null when it was started outside a trace. Every execution of the run opens its span under it, so all of them, after crashes and on other workers, belong to one trace.';
COMMENT ON COLUMN runledger.runs.execution_traceparent IS 'The W3C traceparent of the span of the run''s latest execution, written by the worker that claimed it (runledger._trace_execution) when it records traces: the next execution links its span to it. Null when no execution was traced.';
COMMENT ON COLUMN runledger.runs.in_sessions IS 'True once the run has held a session or queued for one (set by triggers on sessions and session_waiters); null otherwise. When such a run ends, runs_session_release lets go of its sessions and its places in their queues.';
COMMENT ON COLUMN runledger.runs.lineage_id IS 'The run a chain of forks started from: fork_run sets it to its source''s lineage_id, or to the source''s run_id when the source was never forked. Null for a run that was never forked (its lineage is itself). ctx.lineageId is this, or run_id when null: an idempotency key made from it is the same in every fork of the run (and in its retries, which keep the run id).';
COMMENT ON COLUMN runledger.runs.debounce_key IS 'The debounce key of a run started with the start option debounce (start_run): while the run has not started, starts of the same workflow with this key collapse into it (its input replaced, its start delayed again).';
ALTER TABLE runledger.runs ADD CONSTRAINT runs_parent_run_id_fkey FOREIGN KEY (parent_run_id) REFERENCES runledger.runs(run_id) ON DELETE SET NULL;
ALTER TABLE runledger.runs ADD CONSTRAINT runs_pkey PRIMARY KEY (run_id);
CREATE INDEX runs_admission_key ON runledger.runs USING btree (queue_name, COALESCE(concurrency_key, ''::text), priority, created_at, run_id) WHERE ((status = 'PENDING'::runledger.run_status) AND (NOT admitted));
CREATE INDEX runs_admission_order ON runledger.runs USING btree (queue_name, priority, created_at, run_id) WHERE ((status = 'PENDING'::runledger.run_status) AND (NOT admitted));
CREATE INDEX runs_cancelling_unowned ON runledger.runs USING btree (queue_name) WHERE ((status = 'CANCELLING'::runledger.run_status) AND (lease_owner IS NULL));
CREATE INDEX runs_console ON runledger.runs USING btree (status, workflow_name, run_id) WHERE (created_at > '-infinity'::timestamp with time zone);
COMMENT ON INDEX runledger.runs_console IS 'The console''s run lists and counts per status (src/console/queries.ts): one range per (status, workflow) pair, in run_id order. Partial on created_at > ''-infinity'' (always true), which only the console''s and the gauges'' queries name.';
CREATE INDEX runs_deadline ON runledger.runs USING btree (deadline_at) WHERE ((status = ANY (ARRAY['PENDING'::runledger.run_status, 'WAITING'::runledger.run_status])) AND (deadline_at IS NOT NULL));
CREATE UNIQUE INDEX runs_debounce_pending ON runledger.runs USING btree (workflow_name, debounce_key, tenant_id) NULLS NOT DISTINCT WHERE ((debounce_key IS NOT NULL) AND (status = 'PENDING'::runledger.run_status) AND (started_at IS NULL));
CREATE INDEX runs_finished ON runledger.runs USING btree (status, created_at) WHERE (status = ANY (ARRAY['SUCCEEDED'::runledger.run_status, 'FAILED'::runledger.run_status, 'CANCELLED'::runledger.run_status, 'TERMINATED'::runledger.run_status, 'DEAD_LETTER'::runledger.run_status]));
CREATE INDEX runs_forked_from ON runledger.runs USING btree (((version_manifest ->> 'forked_from'::text))) WHERE (version_manifest ? 'forked_from'::text);
CREATE UNIQUE INDEX runs_idempotency_key ON runledger.runs USING btree (workflow_name, idempotency_key) WHERE (idempotency_key IS NOT NULL);
CREATE INDEX runs_idempotency_retention ON runledger.runs USING btree (finished_at) WHERE ((idempotency_key IS NOT NULL) AND (status = ANY (ARRAY['SUCCEEDED'::runledger.run_status, 'FAILED'::runledger.run_status, 'CANCELLED'::runledger.run_status, 'TERMINATED'::runledger.run_status, 'DEAD_LETTER'::runledger.run_status])));
CREATE INDEX runs_lease_expiry ON runledger.runs USING btree (lease_expires_at) WHERE (lease_expires_at IS NOT NULL);
CREATE INDEX runs_migrating ON runledger.runs USING btree (workflow_name, workflow_version) WHERE (migrate_to IS NOT NULL);
CREATE INDEX runs_not_before ON runledger.runs USING btree (queue_name, not_before) WHERE ((status = 'PENDING'::runledger.run_status) AND admitted AND (not_before IS NOT NULL));
CREATE INDEX runs_parent ON runledger.runs USING btree (parent_run_id) WHERE (parent_run_id IS NOT NULL);
CREATE UNIQUE INDEX runs_pkey ON runledger.runs USING btree (run_id);
CREATE INDEX runs_queue_active ON runledger.runs USING btree (queue_name, concurrency_key) WHERE (status = ANY (ARRAY['RUNNING'::runledger.run_status, 'CANCELLING'::runledger.run_status]));
CREATE INDEX runs_ready ON runledger.runs USING btree (queue_name, priority, created_at) WHERE ((status = 'PENDING'::runledger.run_status) AND admitted);
CREATE INDEX runs_retention ON runledger.runs USING btree (finished_at) WHERE (status = ANY (ARRAY['SUCCEEDED'::runledger.run_status, 'FAILED'::runledger.run_status, 'CANCELLED'::runledger.run_status, 'TERMINATED'::runledger.run_status, 'DEAD_LETTER'::runledger.run_status]));
CREATE INDEX runs_tenant ON runledger.runs USING btree (tenant_id, created_at) WHERE (tenant_id IS NOT NULL);
CREATE INDEX runs_timer ON runledger.runs USING btree (queue_name, wake_at) WHERE ((status = 'WAITING'::runledger.run_status) AND (wake_at IS NOT NULL));
CREATE INDEX runs_workflow_world ON runledger.runs USING btree (((input ->> 'runId'::text)), created_at) WHERE (workflow_name = 'workflow-world'::text);
CREATE INDEX runs_workflow_world_key ON runledger.runs USING btree (((input ->> 'idempotencyKey'::text))) WHERE ((workflow_name = 'workflow-world'::text) AND ((input ->> 'idempotencyKey'::text) IS NOT NULL));
CREATE TRIGGER runs_delete_history AFTER DELETE ON runledger.runs REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION runledger._delete_run_history();
COMMENT ON TRIGGER runs_delete_history ON runledger.runs IS 'Deleting runs deletes their checkpoints and events in the same statement (no foreign key, see runledger._delete_run_history).';
CREATE TRIGGER runs_invariants BEFORE INSERT OR UPDATE ON runledger.runs FOR EACH ROW EXECUTE FUNCTION runledger._check_run();
COMMENT ON TRIGGER runs_invariants ON runledger.runs IS 'Every rule a runs row and a change of its status obey, in runledger._check_run (see its comment); a broken rule is reported under its own name (SQLSTATE 23514).';
CREATE TRIGGER runs_session_release AFTER UPDATE OF status ON runledger.runs FOR EACH ROW WHEN (new.in_sessions) EXECUTE FUNCTION runledger._session_on_terminal();
COMMENT ON TRIGGER runs_session_release ON runledger.runs IS 'A run marked in_sessions that reaches a terminal status lets go of its sessions and leaves their queues (runledger._session_on_terminal).';
CREATE TRIGGER runs_truncate_history AFTER TRUNCATE ON runledger.runs FOR EACH STATEMENT EXECUTE FUNCTION runledger._truncate_run_history();
COMMENT ON TRIGGER runs_truncate_history ON runledger.runs IS 'TRUNCATE of runs empties steps and events too (no foreign key, see runledger._truncate_run_history).';

CREATE TABLE runledger.session_entries (
  session_id text COLLATE "C" NOT NULL,
  seq integer NOT NULL,
  role text COLLATE "C" NOT NULL,
  content jsonb NOT NULL,
  run_id text COLLATE "C" NOT NULL,
  step_position integer NOT NULL,
  entry_index integer NOT NULL,
  created_at timestamp with time zone DEFAULT runledger.now() NOT NULL,
  tenant_id text COLLATE "C" DEFAULT ''::text NOT NULL
);
COMMENT ON TABLE runledger.session_entries IS 'The history of each session in order (seq 1, 2, ...): role (system, user, assistant, tool), content (JSON), and the run and step position whose append wrote it, with its index in that append; unique by (run_id, step_position, entry_index), written with that step''s checkpoint.';
COMMENT ON COLUMN runledger.session_entries.tenant_id IS 'The tenant of the entry''s session (with session_id, its key).';
ALTER TABLE runledger.session_entries ADD CONSTRAINT session_entries_once UNIQUE (run_id, step_position, entry_index);
ALTER TABLE runledger.session_entries ADD CONSTRAINT session_entries_pkey PRIMARY KEY (session_id, tenant_id, seq);
ALTER TABLE runledger.session_entries ADD CONSTRAINT session_entries_role CHECK ((role = ANY (ARRAY['system'::text, 'user'::text, 'assistant'::text, 'tool'::text])));
ALTER TABLE runledger.session_entries ADD CONSTRAINT session_entries_session_id_fkey FOREIGN KEY (session_id, tenant_id) REFERENCES runledger.sessions(session_id, tenant_id) ON DELETE CASCADE;
CREATE UNIQUE INDEX session_entries_once ON runledger.session_entries USING btree (run_id, step_position, entry_index);
CREATE UNIQUE INDEX session_entries_pkey ON runledger.session_entries USING btree (session_id, tenant_id, seq);

CREATE TABLE runledger.session_waiters (
  session_id text COLLATE "C" NOT NULL,
  run_id text COLLATE "C" NOT NULL,
  ticket bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
  queued_at timestamp with time zone DEFAULT runledger.now() NOT NULL,
  tenant_id text COLLATE "C" DEFAULT ''::text NOT NULL
);
COMMENT ON TABLE runledger.session_waiters IS 'Runs queued for a held session, served in arrival order (ticket). The first live one becomes the holder when the session is let go, and is woken by a signal on topic session:<id>.';
COMMENT ON COLUMN runledger.session_waiters.tenant_id IS 'The tenant of the session queued for (with session_id, its key): the queued run''s own.';
ALTER TABLE runledger.session_waiters ADD CONSTRAINT session_waiters_pkey PRIMARY KEY (session_id, run_id);
ALTER TABLE runledger.session_waiters ADD CONSTRAINT session_waiters_session_id_fkey FOREIGN KEY (session_id, tenant_id) REFERENCES runledger.sessions(session_id, tenant_id) ON DELETE CASCADE;
CREATE INDEX session_waiters_order ON runledger.session_waiters USING btree (session_id, tenant_id, ticket);
CREATE UNIQUE INDEX session_waiters_pkey ON runledger.session_waiters USING btree (session_id, run_id);
CREATE INDEX session_waiters_run ON runledger.session_waiters USING btree (run_id);
CREATE TRIGGER session_waiters_mark_run AFTER INSERT ON runledger.session_waiters FOR EACH ROW EXECUTE FUNCTION runledger._session_mark_run();
COMMENT ON TRIGGER session_waiters_mark_run ON runledger.session_waiters IS 'A run that queues for a session is marked runs.in_sessions (runledger._session_mark_run).';

CREATE TABLE runledger.sessions (
  session_id text COLLATE "C" NOT NULL,
  holder_run_id text COLLATE "C",
  held_at timestamp with time zone,
  last_holder_run_id text COLLATE "C",
  released_at timestamp with time zone,
  release_reason text COLLATE "C",
  entry_count integer DEFAULT 0 NOT NULL,
  created_at timestamp with time zone DEFAULT runledger.now() NOT NULL,
  updated_at timestamp with time zone DEFAULT runledger.now() NOT NULL,
  tenant_id text COLLATE "C" DEFAULT ''::text NOT NULL,
  budget_limits jsonb,
  budget_used jsonb DEFAULT '{}'::jsonb NOT NULL,
  holder_mark jsonb
);
COMMENT ON TABLE runledger.sessions IS 'Agent sessions: a history that spans runs, held by at most one run at a time (holder_run_id; null = free). Others queue in session_waiters. last_holder_run_id, released_at and release_reason (released, ended, operator) say how it was last let go; entry_count is the seq of its last entry.';
COMMENT ON COLUMN runledger.sessions.tenant_id IS 'The tenant whose runs use this session ('''' for runs without a tenant): with session_id, the session''s key. A run opens, appends to and waits for only its own tenant''s session of an id.';
COMMENT ON COLUMN runledger.sessions.budget_limits IS 'The session''s budget per dimension (units, tokens, cost_usd, tool_calls, turns), spanning every run that holds it; null: none. Set by the last openSession(..., { budget }) or by set_session_budget.';
COMMENT ON COLUMN runledger.sessions.budget_used IS 'What the runs that held the session charged while they held it, added when each let go (the holder''s charges so far are in the view session_budgets).';
COMMENT ON COLUMN runledger.sessions.holder_mark IS 'While a run holds a session that has a budget: {used: the run''s counters when it took it, cap: the limits the session allows it, base: its limits without any session''s cap}. Null otherwise.';
ALTER TABLE runledger.sessions ADD CONSTRAINT sessions_holder_complete CHECK (((holder_run_id IS NULL) = (held_at IS NULL)));
ALTER TABLE runledger.sessions ADD CONSTRAINT sessions_id_valid CHECK (((session_id ~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]*$'::text) AND (length(session_id) <= 92)));
ALTER TABLE runledger.sessions ADD CONSTRAINT sessions_pkey PRIMARY KEY (session_id, tenant_id);
ALTER TABLE runledger.sessions ADD CONSTRAINT sessions_release_reason CHECK ((release_reason = ANY (ARRAY['released'::text, 'ended'::text, 'operator'::text])));
CREATE INDEX sessions_holder ON runledger.sessions USING btree (holder_run_id) WHERE (holder_run_id IS NOT NULL);
CREATE INDEX sessions_idle ON runledger.sessions USING btree (updated_at) WHERE (holder_run_id IS NULL);
CREATE UNIQUE INDEX sessions_pkey ON runledger.sessions USING btree (session_id, tenant_id);
CREATE TRIGGER sessions_mark_holder AFTER INSERT OR UPDATE OF holder_run_id ON runledger.sessions FOR EACH ROW WHEN ((new.holder_run_id IS NOT NULL)) EXECUTE FUNCTION runledger._session_mark_run();
COMMENT ON TRIGGER sessions_mark_holder ON runledger.sessions IS 'A run that takes a session is marked runs.in_sessions (runledger._session_mark_run).';

CREATE TABLE runledger.signals (
  signal_id text COLLATE "C" NOT NULL,
  run_id text COLLATE "C" NOT NULL,
  topic text COLLATE "C" NOT NULL,
  payload jsonb,
  received_at timestamp with time zone DEFAULT runledger.now() NOT NULL,
  consumed_seq integer,
  consumed_at timestamp with time zone
);
COMMENT ON TABLE runledger.signals IS 'Durable signal inbox. A signal_id is accepted once; a signal sent before the run waits is kept until a wait on its topic consumes it (consumed_seq = the consuming step).';
ALTER TABLE runledger.signals ADD CONSTRAINT signals_pkey PRIMARY KEY (signal_id);
ALTER TABLE runledger.signals ADD CONSTRAINT signals_run_id_fkey FOREIGN KEY (run_id) REFERENCES runledger.runs(run_id) ON DELETE CASCADE;
ALTER TABLE runledger.signals ADD CONSTRAINT signals_signal_id_check CHECK (((length(signal_id) >= 1) AND (length(signal_id) <= 200)));
CREATE UNIQUE INDEX signals_pkey ON runledger.signals USING btree (signal_id);
CREATE INDEX signals_run ON runledger.signals USING btree (run_id);
CREATE INDEX signals_unconsumed ON runledger.signals USING btree (run_id, topic, received_at) WHERE (consumed_seq IS NULL);

CREATE TABLE runledger.step_progress (
  run_id text COLLATE "C" NOT NULL,
  seq integer NOT NULL,
  progress jsonb,
  updated_at timestamp with time zone DEFAULT runledger.now() NOT NULL
);
COMMENT ON TABLE runledger.step_progress IS 'Last progress a long step reported with ctx.heartbeat (e.g. a cursor); the attempt that takes over the step reads it to continue instead of starting over.';
ALTER TABLE runledger.step_progress ADD CONSTRAINT step_progress_pkey PRIMARY KEY (run_id, seq);
ALTER TABLE runledger.step_progress ADD CONSTRAINT step_progress_run_id_fkey FOREIGN KEY (run_id) REFERENCES runledger.runs(run_id) ON DELETE CASCADE;
CREATE UNIQUE INDEX step_progress_pkey ON runledger.step_progress USING btree (run_id, seq);

CREATE TABLE runledger.steps (
  run_id text COLLATE "C" NOT NULL,
  seq integer NOT NULL,
  name text COLLATE "C" NOT NULL,
  kind text COLLATE "C" NOT NULL,
  status text COLLATE "C" NOT NULL,
  output jsonb,
  error jsonb,
  attempts integer DEFAULT 1 NOT NULL,
  started_at timestamp with time zone NOT NULL,
  finished_at timestamp with time zone DEFAULT runledger.now() NOT NULL,
  fencing_token bigint NOT NULL,
  output_hash text COLLATE "C"
);
COMMENT ON TABLE runledger.steps IS 'Checkpoints: one row per completed step of a run, at its position seq. A step whose row exists is never executed again; replay returns output (or rethrows error).';
ALTER TABLE runledger.steps ADD CONSTRAINT steps_invariants CHECK (runledger._check_step(seq, kind, status));
COMMENT ON CONSTRAINT steps_invariants ON runledger.steps IS 'Every rule a steps row obeys, in runledger._check_step (see its comment); a broken rule is reported under its own name.';
ALTER TABLE runledger.steps ADD CONSTRAINT steps_pkey PRIMARY KEY (run_id, seq);
CREATE INDEX steps_patch_markers ON runledger.steps USING btree (name) WHERE (name ~~ '@patch:%'::text);
CREATE UNIQUE INDEX steps_pkey ON runledger.steps USING btree (run_id, seq);

CREATE TABLE runledger.stream_chunks (
  run_id text COLLATE "C" NOT NULL,
  topic text COLLATE "C" NOT NULL,
  "offset" bigint NOT NULL,
  chunk jsonb NOT NULL,
  seq integer NOT NULL,
  attempt integer NOT NULL,
  fencing_token bigint NOT NULL,
  created_at timestamp with time zone DEFAULT runledger.now() NOT NULL
);
COMMENT ON TABLE runledger.stream_chunks IS 'Durable streams (ctx.stream(topic).write): one row per chunk at its offset (0, 1, 2 ... per run and topic, no gaps). The first write of an offset wins: a re-execution after a crash writes the same offsets again and stores nothing new. Read with runledger.read_stream or engine.readStream.';
COMMENT ON COLUMN runledger.stream_chunks."offset" IS 'Position of the chunk in its stream, from 0. Chunks written at step position seq continue after the last chunk written at positions before seq, so a replay gives the same offsets (docs/streams.md).';
COMMENT ON COLUMN runledger.stream_chunks.chunk IS 'The chunk as the workflow wrote it (any JSON value; a JSON null is the jsonb value null).';
COMMENT ON COLUMN runledger.stream_chunks.seq IS 'The step position the chunk was written at: the ctx call in flight (a step writing it), else the next position (the workflow body between steps).';
COMMENT ON COLUMN runledger.stream_chunks.attempt IS 'ctx.attempt of the execution that wrote the chunk (1, then +1 per recovery after a lost lease).';
COMMENT ON COLUMN runledger.stream_chunks.fencing_token IS 'Fencing token of the execution that wrote the chunk: which claim of the run it came from.';
ALTER TABLE runledger.stream_chunks ADD CONSTRAINT stream_chunks_offset_check CHECK (("offset" >= 0));
ALTER TABLE runledger.stream_chunks ADD CONSTRAINT stream_chunks_pkey PRIMARY KEY (run_id, topic, "offset");
ALTER TABLE runledger.stream_chunks ADD CONSTRAINT stream_chunks_run_id_fkey FOREIGN KEY (run_id) REFERENCES runledger.runs(run_id) ON DELETE CASCADE;
ALTER TABLE runledger.stream_chunks ADD CONSTRAINT stream_chunks_topic_check CHECK (((topic ~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]*$'::text) AND (length(topic) <= 100)));
CREATE UNIQUE INDEX stream_chunks_pkey ON runledger.stream_chunks USING btree (run_id, topic, "offset");

CREATE TABLE runledger.stream_ends (
  run_id text COLLATE "C" NOT NULL,
  topic text COLLATE "C" NOT NULL,
  end_offset bigint NOT NULL,
  seq integer NOT NULL,
  fencing_token bigint NOT NULL,
  closed_at timestamp with time zone DEFAULT runledger.now() NOT NULL
);
COMMENT ON TABLE runledger.stream_ends IS 'Closed streams (ctx.stream(topic).close): the stream holds the chunks at offsets 0 .. end_offset - 1 and no more; readers stop there. The first close wins; chunks at or past end_offset are not stored.';
COMMENT ON COLUMN runledger.stream_ends.end_offset IS 'The stream''s length when it was closed: the offset after its last chunk.';
ALTER TABLE runledger.stream_ends ADD CONSTRAINT stream_ends_end_offset_check CHECK ((end_offset >= 0));
ALTER TABLE runledger.stream_ends ADD CONSTRAINT stream_ends_pkey PRIMARY KEY (run_id, topic);
ALTER TABLE runledger.stream_ends ADD CONSTRAINT stream_ends_run_id_fkey FOREIGN KEY (run_id) REFERENCES runledger.runs(run_id) ON DELETE CASCADE;
ALTER TABLE runledger.stream_ends ADD CONSTRAINT stream_ends_topic_check CHECK (((topic ~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]*$'::text) AND (length(topic) <= 100)));
CREATE UNIQUE INDEX stream_ends_pkey ON runledger.stream_ends USING btree (run_id, topic);

CREATE TABLE runledger.tenant_members (
  role_name text COLLATE "C" NOT NULL,
  tenant_id text COLLATE "C" NOT NULL
);
COMMENT ON TABLE runledger.tenant_members IS 'Which tenants a role (or any member of it) may act for when tenant isolation is on. A role with rows here sees only those tenants, whatever runledger.tenant it sets; a role with none may name any tenant (the application that connects it chooses). Written by the schema''s owner.';
ALTER TABLE runledger.tenant_members ADD CONSTRAINT tenant_members_pkey PRIMARY KEY (role_name, tenant_id);
CREATE UNIQUE INDEX tenant_members_pkey ON runledger.tenant_members USING btree (role_name, tenant_id);

CREATE TABLE runledger.wf_events (
  event_id text COLLATE "C" NOT NULL,
  run_id text COLLATE "C" NOT NULL,
  event_type text COLLATE "C" NOT NULL,
  correlation_id text COLLATE "C",
  event_data json,
  spec_version integer,
  created_at timestamp with time zone DEFAULT runledger.now() NOT NULL
);
COMMENT ON TABLE runledger.wf_events IS 'The event log of each Workflow SDK run (runledger/workflow-world), in event_id order (ULIDs): run_created ... run_completed, step_*, hook_*, wait_*, attr_set. The SDK replays a run from it.';
ALTER TABLE runledger.wf_events ADD CONSTRAINT wf_events_pkey PRIMARY KEY (event_id);
CREATE INDEX wf_events_correlation ON runledger.wf_events USING btree (correlation_id, event_id);
CREATE UNIQUE INDEX wf_events_entity_creation ON runledger.wf_events USING btree (run_id, correlation_id, event_type) WHERE (event_type = ANY (ARRAY['step_created'::text, 'hook_created'::text, 'wait_created'::text, 'attr_set'::text]));
CREATE UNIQUE INDEX wf_events_pkey ON runledger.wf_events USING btree (event_id);
CREATE INDEX wf_events_run ON runledger.wf_events USING btree (run_id, event_id);

CREATE TABLE runledger.wf_hooks (
  hook_id text COLLATE "C" NOT NULL,
  run_id text COLLATE "C" NOT NULL,
  token text COLLATE "C" NOT NULL,
  metadata json,
  is_webhook boolean DEFAULT true NOT NULL,
  is_system boolean DEFAULT false NOT NULL,
  spec_version integer,
  created_at timestamp with time zone DEFAULT runledger.now() NOT NULL
);
COMMENT ON TABLE runledger.wf_hooks IS 'The live hooks of Workflow SDK runs (runledger/workflow-world): a hook waits for payloads sent to its token (resumeHook); it is deleted when disposed or when its run ends.';
ALTER TABLE runledger.wf_hooks ADD CONSTRAINT wf_hooks_pkey PRIMARY KEY (hook_id);
ALTER TABLE runledger.wf_hooks ADD CONSTRAINT wf_hooks_token_key UNIQUE (token);
CREATE UNIQUE INDEX wf_hooks_pkey ON runledger.wf_hooks USING btree (hook_id);
CREATE INDEX wf_hooks_run ON runledger.wf_hooks USING btree (run_id, hook_id);
CREATE UNIQUE INDEX wf_hooks_token_key ON runledger.wf_hooks USING btree (token);

CREATE TABLE runledger.wf_runs (
  run_id text COLLATE "C" NOT NULL,
  deployment_id text COLLATE "C" NOT NULL,
  workflow_name text COLLATE "C" NOT NULL,
  status text COLLATE "C" DEFAULT 'pending'::text NOT NULL,
  spec_version integer,
  input json,
  output json,
  error json,
  error_code text COLLATE "C",
  execution_context json,
  attributes jsonb DEFAULT '{}'::jsonb NOT NULL,
  extra json,
  created_at timestamp with time zone DEFAULT runledger.now() NOT NULL,
  updated_at timestamp with time zone DEFAULT runledger.now() NOT NULL,
  started_at timestamp with time zone,
  completed_at timestamp with time zone,
  expired_at timestamp with time zone
);
COMMENT ON TABLE runledger.wf_runs IS 'Workflow SDK runs (runledger/workflow-world): one row per run, materialized from its events in wf_events (status pending, running, completed, failed or cancelled; input, output and error as the SDK serialized them).';
ALTER TABLE runledger.wf_runs ADD CONSTRAINT wf_runs_pkey PRIMARY KEY (run_id);
ALTER TABLE runledger.wf_runs ADD CONSTRAINT wf_runs_status_check CHECK ((status = ANY (ARRAY['pending'::text, 'running'::text, 'completed'::text, 'failed'::text, 'cancelled'::text])));
CREATE INDEX wf_runs_name ON runledger.wf_runs USING btree (workflow_name, run_id);
CREATE UNIQUE INDEX wf_runs_pkey ON runledger.wf_runs USING btree (run_id);
CREATE INDEX wf_runs_status ON runledger.wf_runs USING btree (status, run_id);

CREATE TABLE runledger.wf_steps (
  run_id text COLLATE "C" NOT NULL,
  step_id text COLLATE "C" NOT NULL,
  step_name text COLLATE "C" NOT NULL,
  status text COLLATE "C" DEFAULT 'pending'::text NOT NULL,
  input json,
  output json,
  error json,
  attempt integer DEFAULT 0 NOT NULL,
  started_at timestamp with time zone,
  completed_at timestamp with time zone,
  retry_after timestamp with time zone,
  spec_version integer,
  created_at timestamp with time zone DEFAULT runledger.now() NOT NULL,
  updated_at timestamp with time zone DEFAULT runledger.now() NOT NULL
);
COMMENT ON TABLE runledger.wf_steps IS 'The steps of Workflow SDK runs (runledger/workflow-world): status, attempts, input, output or error, and when a retry may start (retry_after).';
ALTER TABLE runledger.wf_steps ADD CONSTRAINT wf_steps_pkey PRIMARY KEY (run_id, step_id);
ALTER TABLE runledger.wf_steps ADD CONSTRAINT wf_steps_status_check CHECK ((status = ANY (ARRAY['pending'::text, 'running'::text, 'completed'::text, 'failed'::text, 'cancelled'::text])));
CREATE UNIQUE INDEX wf_steps_pkey ON runledger.wf_steps USING btree (run_id, step_id);

CREATE TABLE runledger.wf_stream_chunks (
  seq bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
  stream_name text COLLATE "C" NOT NULL,
  run_id text COLLATE "C",
  data bytea NOT NULL,
  eof boolean DEFAULT false NOT NULL,
  created_at timestamp with time zone DEFAULT runledger.now() NOT NULL
);
COMMENT ON TABLE runledger.wf_stream_chunks IS 'The chunks of Workflow SDK streams (runledger/workflow-world), in seq order per stream; a row with eof closes the stream. A reader tails it on NOTIFY runledger_wf_stream.';
ALTER TABLE runledger.wf_stream_chunks ADD CONSTRAINT wf_stream_chunks_pkey PRIMARY KEY (seq);
CREATE UNIQUE INDEX wf_stream_chunks_pkey ON runledger.wf_stream_chunks USING btree (seq);
CREATE INDEX wf_stream_chunks_run ON runledger.wf_stream_chunks USING btree (run_id, stream_name);
CREATE INDEX wf_stream_chunks_stream ON runledger.wf_stream_chunks USING btree (stream_name, seq);

CREATE TABLE runledger.wf_waits (
  run_id text COLLATE "C" NOT NULL,
  correlation_id text COLLATE "C" NOT NULL,
  status text COLLATE "C" DEFAULT 'waiting'::text NOT NULL,
  resume_at timestamp with time zone,
  completed_at timestamp with time zone,
  spec_version integer,
  created_at timestamp with time zone DEFAULT runledger.now() NOT NULL,
  updated_at timestamp with time zone DEFAULT runledger.now() NOT NULL
);
COMMENT ON TABLE runledger.wf_waits IS 'The sleeps of Workflow SDK runs (runledger/workflow-world): waiting until resume_at, then completed.';
ALTER TABLE runledger.wf_waits ADD CONSTRAINT wf_waits_pkey PRIMARY KEY (run_id, correlation_id);
ALTER TABLE runledger.wf_waits ADD CONSTRAINT wf_waits_status_check CHECK ((status = ANY (ARRAY['waiting'::text, 'completed'::text])));
CREATE UNIQUE INDEX wf_waits_pkey ON runledger.wf_waits USING btree (run_id, correlation_id);

CREATE TABLE runledger.workers (
  worker_id text COLLATE "C" NOT NULL,
  host text COLLATE "C" NOT NULL,
  pid integer NOT NULL,
  workflows text[] COLLATE "C" NOT NULL,
  migrations text[] COLLATE "C" DEFAULT '{}'::text[] NOT NULL,
  queues text[] COLLATE "C" NOT NULL,
  concurrency integer NOT NULL,
  lease_ms integer NOT NULL,
  started_at timestamp with time zone DEFAULT runledger.now() NOT NULL,
  last_heartbeat_at timestamp with time zone DEFAULT runledger.now() NOT NULL,
  stopped_at timestamp with time zone
);
COMMENT ON TABLE runledger.workers IS 'Worker processes: what they serve (workflow@version, queues), the run migrations they apply (workflow@from>to), their lease length and last heartbeat. A worker silent for longer than its lease is considered dead.';
ALTER TABLE runledger.workers ADD CONSTRAINT workers_pkey PRIMARY KEY (worker_id);
CREATE UNIQUE INDEX workers_pkey ON runledger.workers USING btree (worker_id);

CREATE TABLE runledger.workflows (
  workflow_name text COLLATE "C" NOT NULL,
  workflow_version text COLLATE "C" NOT NULL,
  queue_name text COLLATE "C" NOT NULL,
  max_recovery_attempts integer NOT NULL,
  limits jsonb DEFAULT '{}'::jsonb NOT NULL,
  manifest jsonb,
  registered_at timestamp with time zone DEFAULT runledger.now() NOT NULL
);
COMMENT ON TABLE runledger.workflows IS 'Workflow (name, version) pairs registered by engines and workers. start_run uses it to resolve the default version, queue and recovery limit of a run started from SQL.';
ALTER TABLE runledger.workflows ADD CONSTRAINT workflows_max_recovery_attempts_check CHECK ((max_recovery_attempts >= 0));
ALTER TABLE runledger.workflows ADD CONSTRAINT workflows_pkey PRIMARY KEY (workflow_name, workflow_version);
ALTER TABLE runledger.workflows ADD CONSTRAINT workflows_queue_name_check CHECK ((queue_name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$'::text));
ALTER TABLE runledger.workflows ADD CONSTRAINT workflows_workflow_name_check CHECK ((workflow_name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,49}$'::text));
ALTER TABLE runledger.workflows ADD CONSTRAINT workflows_workflow_version_check CHECK ((workflow_version ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,19}$'::text));
CREATE UNIQUE INDEX workflows_pkey ON runledger.workflows USING btree (workflow_name, workflow_version);

-- views

CREATE VIEW runledger.active AS
 SELECT run_id,
    workflow_name,
    workflow_version,
    queue_name,
    status,
    wait_kind,
    wake_at,
    lease_owner,
    lease_expires_at,
    lease_expires_at - runledger.now() AS lease_remaining,
    fencing_token,
    recovery_attempts,
    max_recovery_attempts,
    ( SELECT count(*) AS count
           FROM runledger.steps s
          WHERE s.run_id = r.run_id) AS steps_done,
    created_at,
    updated_at,
    runledger.now() - created_at AS age
   FROM runledger.runs r
  WHERE status = ANY (ARRAY['PENDING'::runledger.run_status, 'RUNNING'::runledger.run_status, 'WAITING'::runledger.run_status, 'CANCELLING'::runledger.run_status]);
COMMENT ON VIEW runledger.active IS 'Runs not yet finished (PENDING, RUNNING, WAITING, CANCELLING): owner, lease remaining, fencing token, recovery attempts, checkpoints written.';

CREATE VIEW runledger.approval_inbox AS
 SELECT a.request_id,
    a.run_id,
    r.workflow_name,
    a.name,
    a.action,
    a.evidence,
    a.approvers,
    a.requested_at,
    a.expires_at
   FROM runledger.approvals a
     JOIN runledger.runs r ON r.run_id = a.run_id
  WHERE a.decision IS NULL AND (a.expires_at IS NULL OR a.expires_at > runledger.now()) AND r.status = 'WAITING'::runledger.run_status;
COMMENT ON VIEW runledger.approval_inbox IS 'Pending approval requests: the action asked for, its evidence, who may decide and until when. Decide with select runledger.decide_approval(request_id, true|false, ''name'', ''note'').';

CREATE VIEW runledger.artifact_list AS
 SELECT a.artifact_id,
    a.run_id,
    r.workflow_name,
    a.name,
    a.kind,
    a.sha256,
    a.size,
    a.ref,
    a.blob IS NOT NULL AS stored,
    a.step_position,
    a.created_at
   FROM runledger.artifacts a
     JOIN runledger.runs r ON r.run_id = a.run_id;
COMMENT ON VIEW runledger.artifact_list IS 'Every artifact and stored value with its run and workflow, sha256, size, and where its content is: stored (in artifact_blobs) or ref (elsewhere). engine.readArtifact(artifactId) reads the content.';

CREATE VIEW runledger.cost_stats AS
 WITH per_run AS (
         SELECT r.workflow_name,
            r.workflow_version,
            r.version_manifest ->> 'runtime'::text AS runtime_version,
            r.version_manifest ->> 'checkpointSchema'::text AS checkpoint_schema_version,
            COALESCE(r.version_manifest -> 'manifest'::text, '{}'::jsonb) AS manifest,
            r.status,
            r.termination_reason,
            r.status = 'SUCCEEDED'::runledger.run_status AND r.termination_evidence ? 'verification'::text AS verified,
            r.budget_spent AS units,
            COALESCE((r.budget_used ->> 'tokens'::text)::numeric, 0::numeric) AS tokens,
            COALESCE((r.budget_used ->> 'cost_usd'::text)::numeric, 0::numeric) AS cost_usd,
            COALESCE((r.budget_used ->> 'tool_calls'::text)::numeric, 0::numeric) AS tool_calls,
            COALESCE((r.budget_used ->> 'turns'::text)::numeric, 0::numeric) AS turns,
            (( SELECT COALESCE(sum(EXTRACT(epoch FROM
                        CASE
                            WHEN s.status = 'WAITING'::text THEN runledger.now()
                            ELSE s.finished_at
                        END - s.started_at)), 0::numeric) AS "coalesce"
                   FROM runledger.steps s
                  WHERE s.run_id = r.run_id AND (s.kind = ANY (ARRAY['sleep'::text, 'signal'::text, 'approval'::text, 'child'::text])))) / 86400.0 AS waiting_days,
            (COALESCE(pg_column_size(r.input), 0) + COALESCE(pg_column_size(r.output), 0) + COALESCE(pg_column_size(r.error), 0) + (( SELECT COALESCE(sum(COALESCE(pg_column_size(s.output), 0) + COALESCE(pg_column_size(s.error), 0)), 0::bigint) AS "coalesce"
                   FROM runledger.steps s
                  WHERE s.run_id = r.run_id)) + (( SELECT COALESCE(sum(pg_column_size(c.chunk)), 0::bigint) AS "coalesce"
                   FROM runledger.stream_chunks c
                  WHERE c.run_id = r.run_id)))::numeric + (( SELECT COALESCE(sum(a.size), 0::numeric) AS "coalesce"
                   FROM runledger.artifacts a
                  WHERE a.run_id = r.run_id AND a.blob IS NOT NULL)) AS bytes
           FROM runledger.runs r
        )
 SELECT workflow_name,
    workflow_version,
    runtime_version,
    checkpoint_schema_version,
    manifest,
    count(*) AS runs,
    count(*) FILTER (WHERE status = 'SUCCEEDED'::runledger.run_status) AS succeeded,
    count(*) FILTER (WHERE verified) AS verified_succeeded,
    count(*) FILTER (WHERE status = ANY (ARRAY['FAILED'::runledger.run_status, 'TERMINATED'::runledger.run_status, 'DEAD_LETTER'::runledger.run_status, 'CANCELLED'::runledger.run_status])) AS not_succeeded,
    count(*) FILTER (WHERE termination_reason = 'POLICY'::text) AS stopped_by_policy,
    sum(units) AS units,
    sum(tokens) AS tokens,
    sum(cost_usd) AS cost_usd,
    sum(tool_calls) AS tool_calls,
    sum(turns) AS turns,
    sum(cost_usd) / NULLIF(count(*) FILTER (WHERE verified), 0)::numeric AS cost_usd_per_verified_run,
    sum(tokens) / NULLIF(count(*) FILTER (WHERE verified), 0)::numeric AS tokens_per_verified_run,
    sum(cost_usd) / NULLIF(count(*) FILTER (WHERE status = 'SUCCEEDED'::runledger.run_status), 0)::numeric AS cost_usd_per_succeeded_run,
    sum(waiting_days) AS waiting_run_days,
    count(*) FILTER (WHERE status = 'WAITING'::runledger.run_status) AS waiting_now,
    (sum(bytes) / count(*)::numeric)::bigint AS bytes_per_run
   FROM per_run p
  GROUP BY workflow_name, workflow_version, runtime_version, checkpoint_schema_version, manifest;
COMMENT ON VIEW runledger.cost_stats IS 'What runs cost, per workflow, version, runtime version, checkpoint schema version and version manifest (the user''s manifest: agent, prompt, tool versions): runs, succeeded and verified succeeded runs (SUCCEEDED with the evidence of a verify), runs that did not succeed and those a policy stopped; spend per budget dimension (units, tokens, cost_usd, tool_calls, turns); cost and tokens per verified successful run (the spend of every run, failed ones included, over the verified ones) and cost per succeeded run; run-days spent in durable waits (sleep, signal, approval, child; ongoing waits counted to now) and runs waiting now; bytes stored per run (input, output, error, checkpoints, stream chunks, stored artifacts). Reads every run and its history.';

CREATE VIEW runledger.dead_letter AS
 SELECT run_id,
    workflow_name,
    workflow_version,
    queue_name,
    termination_reason,
    termination_evidence,
    terminated_at,
    recovery_attempts,
    max_recovery_attempts,
    error,
    ( SELECT count(*) AS count
           FROM runledger.steps s
          WHERE s.run_id = r.run_id) AS steps_done,
    created_at,
    runledger._compensations_due(run_id) AS compensations_due
   FROM runledger.runs r
  WHERE status = 'DEAD_LETTER'::runledger.run_status;
COMMENT ON VIEW runledger.dead_letter IS 'Runs out of the automatic path (max recovery attempts, non-determinism, ...), with the termination reason and evidence. Bring one back with select runledger.retry_run(run_id); compensations_due says it did things not undone yet (runledger.compensate_run(run_id) undoes them).';

CREATE VIEW runledger.graph_threads AS
 SELECT thread_id,
    count(*)::integer AS checkpoints,
    max(checkpoint_id) AS latest_checkpoint_id,
    (array_agg(metadata ORDER BY checkpoint_id DESC))[1] AS latest_metadata,
    (array_agg(run_id ORDER BY checkpoint_id DESC))[1] AS latest_run_id,
    ( SELECT count(*)::integer AS count
           FROM runledger.graph_writes w
          WHERE w.thread_id = c.thread_id AND w.checkpoint_id = max(c.checkpoint_id) AND w.checkpoint_ns = ''::text) AS pending_writes,
    max(created_at) AS updated_at
   FROM runledger.graph_checkpoints c
  WHERE checkpoint_ns = ''::text
  GROUP BY thread_id;
COMMENT ON VIEW runledger.graph_threads IS 'One row per LangGraph thread (its root namespace): how many checkpoints, the latest one''s id and metadata (source, step), the run that wrote it, the pending writes after it, when it was written.';

CREATE VIEW runledger.live_workers AS
 SELECT worker_id,
    host,
    pid,
    workflows,
    migrations,
    queues,
    concurrency,
    lease_ms,
    started_at,
    last_heartbeat_at,
    stopped_at
   FROM runledger.workers w
  WHERE stopped_at IS NULL AND last_heartbeat_at > (runledger.now() - make_interval(secs => (lease_ms::numeric / 1000.0)::double precision));
COMMENT ON VIEW runledger.live_workers IS 'Worker processes that are live: not stopped, and heard from within their lease. What they serve (workflows, as workflow@version) decides which runs are stranded.';

CREATE VIEW runledger.patches AS
 WITH taken AS (
         SELECT r.workflow_name,
            r.workflow_version,
            substr(s.name, 8) AS patch,
            count(*) AS runs_taken,
            count(*) FILTER (WHERE r.status <> ALL (ARRAY['SUCCEEDED'::runledger.run_status, 'CANCELLED'::runledger.run_status, 'TERMINATED'::runledger.run_status])) AS replayable_taken,
            min(s.finished_at) AS first_taken_at
           FROM runledger.steps s
             JOIN runledger.runs r ON r.run_id = s.run_id
          WHERE s.name ~~ '@patch:%'::text
          GROUP BY r.workflow_name, r.workflow_version, (substr(s.name, 8))
        )
 SELECT t.workflow_name,
    t.workflow_version,
    t.patch,
    t.runs_taken,
    t.replayable_taken,
    t.first_taken_at,
    b.replayable_before
   FROM taken t
     CROSS JOIN LATERAL ( SELECT count(*) AS replayable_before
           FROM runledger.runs o
          WHERE o.workflow_name = t.workflow_name AND o.workflow_version = t.workflow_version AND (o.status <> ALL (ARRAY['SUCCEEDED'::runledger.run_status, 'CANCELLED'::runledger.run_status, 'TERMINATED'::runledger.run_status])) AND o.created_at < t.first_taken_at AND NOT (EXISTS ( SELECT 1
                   FROM runledger.steps p
                  WHERE p.run_id = o.run_id AND p.name = ('@patch:'::text || t.patch)))) b;
COMMENT ON VIEW runledger.patches IS 'Per workflow version and patch (ctx.patched): runs that took it, how many of them may still execute or replay (not SUCCEEDED, CANCELLED or TERMINATED), when it was first taken, and replayable_before: runs from before the patch that did not take it and may still replay, so still need the old branch. At replayable_before = 0 the old branch can go (ctx.deprecatePatch); at replayable_taken = 0 the deprecatePatch call can go too.';

CREATE VIEW runledger.queue_stats AS
 SELECT r.queue_name,
        CASE
            WHEN GROUPING(r.concurrency_key) = 1 THEN NULL::text
            ELSE COALESCE(r.concurrency_key, ''::text)
        END AS concurrency_key,
    GROUPING(r.concurrency_key) = 1 AS queue_total,
    count(*) FILTER (WHERE r.status = 'PENDING'::runledger.run_status AND NOT r.admitted) AS waiting_admission,
    count(*) FILTER (WHERE r.status = 'PENDING'::runledger.run_status AND r.admitted) AS dispatched,
    count(*) FILTER (WHERE r.status = ANY (ARRAY['RUNNING'::runledger.run_status, 'CANCELLING'::runledger.run_status])) AS running,
    count(*) FILTER (WHERE r.status = 'WAITING'::runledger.run_status) AS waiting,
    runledger.now() - min(r.created_at) FILTER (WHERE r.status = 'PENDING'::runledger.run_status) AS oldest_pending_age,
    max(q.concurrency) AS concurrency,
    max(q.per_key_concurrency) AS per_key_concurrency,
    max(q.rate_limit_max) AS rate_limit_max,
    max(q.rate_limit_period_ms) AS rate_limit_period_ms,
    bool_or(q.paused) AS paused
   FROM runledger.runs r
     LEFT JOIN runledger.queues q ON q.name = r.queue_name
  WHERE r.status = ANY (ARRAY['PENDING'::runledger.run_status, 'RUNNING'::runledger.run_status, 'CANCELLING'::runledger.run_status, 'WAITING'::runledger.run_status])
  GROUP BY GROUPING SETS ((r.queue_name), (r.queue_name, r.concurrency_key));
COMMENT ON VIEW runledger.queue_stats IS 'Per queue (queue_total = true) and per concurrency key: runs waiting for admission, dispatched, running, waiting, the oldest pending age, and the queue''s limits. For dashboards and alerts.';

CREATE VIEW runledger.rate_limits AS
 SELECT key,
    max_calls,
    per,
    (( SELECT count(*) AS count
           FROM runledger.rate_limit_calls c
          WHERE c.key = k.key AND c.at > (runledger.now() - (k.per + LEAST(k.per * 0.1::double precision, '00:00:01'::interval)))))::integer AS calls_in_window,
    ( SELECT min(c.at) + (k.per + LEAST(k.per * 0.1::double precision, '00:00:01'::interval))
           FROM runledger.rate_limit_calls c
          WHERE c.key = k.key AND c.at > (runledger.now() - (k.per + LEAST(k.per * 0.1::double precision, '00:00:01'::interval)))) AS next_place_at,
        CASE
            WHEN paused_until > runledger.now() THEN paused_until
            ELSE NULL::timestamp with time zone
        END AS paused_until,
        CASE
            WHEN paused_until > runledger.now() THEN pause_reason
            ELSE NULL::jsonb
        END AS pause_reason,
    (( SELECT count(*) AS count
           FROM runledger.rate_limit_waiters w
             JOIN runledger.runs r ON r.run_id = w.run_id
          WHERE w.key = k.key AND NOT runledger.is_terminal(r.status)))::integer AS waiters,
    ( SELECT min(w.since) AS min
           FROM runledger.rate_limit_waiters w
             JOIN runledger.runs r ON r.run_id = w.run_id
          WHERE w.key = k.key AND NOT runledger.is_terminal(r.status)) AS oldest_waiter_since,
    updated_at
   FROM runledger.rate_limit_keys k;
COMMENT ON VIEW runledger.rate_limits IS 'Each shared rate limit key: its limit (max_calls per per; null: pauses only), the calls let through in the current window and when the window next frees a place, its pause (paused_until and why, while it lasts), and the step positions waiting for a permit (in memory or as WAITING runs) with the oldest one''s wait start.';

CREATE VIEW runledger.run_timeline AS
 SELECT e.run_id,
    e.at,
    'event'::text AS entry,
    e.kind AS what,
    NULL::integer AS seq,
    NULL::text AS status,
    e.detail,
    e.fencing_token,
    NULL::numeric AS duration_ms
   FROM runledger.events e
UNION ALL
 SELECT s.run_id,
    s.finished_at AS at,
    'step'::text AS entry,
    s.name AS what,
    s.seq,
    s.status,
    COALESCE(s.error, jsonb_build_object('kind', s.kind, 'attempts', s.attempts)) AS detail,
    s.fencing_token,
    round(EXTRACT(epoch FROM s.finished_at - s.started_at) * 1000::numeric, 1) AS duration_ms
   FROM runledger.steps s;
COMMENT ON VIEW runledger.run_timeline IS 'History of runs: lifecycle events and step checkpoints. Use: select * from runledger.run_timeline where run_id = ''...'' order by at.';

CREATE VIEW runledger.session_budgets AS
 SELECT s.session_id,
    NULLIF(s.tenant_id, ''::text) AS tenant_id,
    s.budget_limits AS budget,
    x.spent,
    ( SELECT COALESCE(jsonb_object_agg(l.key, GREATEST(0::numeric, l.value::numeric - COALESCE((x.spent ->> l.key)::numeric, 0::numeric))), '{}'::jsonb) AS "coalesce"
           FROM jsonb_each_text(COALESCE(s.budget_limits, '{}'::jsonb)) l(key, value)) AS remaining,
    (EXISTS ( SELECT 1
           FROM jsonb_each_text(COALESCE(s.budget_limits, '{}'::jsonb)) l(key, value)
          WHERE COALESCE((x.spent ->> l.key)::numeric, 0::numeric) >= l.value::numeric)) AS exhausted,
    s.holder_run_id,
    s.updated_at
   FROM runledger.sessions s
     CROSS JOIN LATERAL ( SELECT COALESCE(jsonb_object_agg(d.dim, d.amount), '{}'::jsonb) AS spent
           FROM ( SELECT a.dim,
                    sum(a.amount) AS amount
                   FROM ( SELECT e.key AS dim,
                            e.value::numeric AS amount
                           FROM jsonb_each_text(s.budget_used) e(key, value)
                        UNION ALL
                         SELECT e.key,
                            e.value::numeric - COALESCE(((s.holder_mark -> 'used'::text) ->> e.key)::numeric, 0::numeric)
                           FROM runledger.runs r,
                            LATERAL jsonb_each_text(COALESCE(r.budget_used, '{}'::jsonb) || jsonb_build_object('units', r.budget_spent)) e(key, value)
                          WHERE r.run_id = s.holder_run_id AND s.holder_mark IS NOT NULL) a
                  GROUP BY a.dim
                 HAVING sum(a.amount) <> 0::numeric) d) x
  WHERE s.budget_limits IS NOT NULL OR s.budget_used <> '{}'::jsonb;
COMMENT ON VIEW runledger.session_budgets IS 'Each session with a budget (or spending recorded against one): its budget per dimension, what the runs that held it spent (the holder''s charges so far included), what remains, whether a dimension is used up, and the holder.';

CREATE VIEW runledger.session_list AS
 SELECT s.session_id,
    s.holder_run_id,
    r.status AS holder_status,
    r.workflow_name AS holder_workflow,
    s.held_at,
    COALESCE(w.run_ids, '{}'::text[]) AS waiting_run_ids,
    COALESCE(cardinality(w.run_ids), 0) AS waiters,
    s.entry_count AS entries,
    s.last_holder_run_id,
    s.release_reason,
    s.released_at,
    s.created_at,
    s.updated_at,
    NULLIF(s.tenant_id, ''::text) AS tenant_id
   FROM runledger.sessions s
     LEFT JOIN runledger.runs r ON r.run_id = s.holder_run_id
     LEFT JOIN LATERAL ( SELECT array_agg(q.run_id ORDER BY q.ticket) AS run_ids
           FROM runledger.session_waiters q
          WHERE q.session_id = s.session_id AND q.tenant_id = s.tenant_id) w ON true;
COMMENT ON VIEW runledger.session_list IS 'Every session: its holder (run, status, workflow, since when), the runs queued for it in order, its entry count, how it was last let go, and its tenant (null: runs without a tenant; a session id is one session per tenant). select * from runledger.session_history(id) lists one session''s entries (of the tenant runledger.tenant names).';

CREATE VIEW runledger.stranded_runs AS
 SELECT run_id,
    workflow_name,
    workflow_version,
    status,
    wait_kind,
    queue_name,
    created_at,
    updated_at,
    version_manifest,
    ( SELECT array_agg(DISTINCT split_part(v.v, '@'::text, 2) ORDER BY (split_part(v.v, '@'::text, 2))) AS array_agg
           FROM runledger.live_workers w,
            LATERAL unnest(w.workflows) v(v)
          WHERE split_part(v.v, '@'::text, 1) = r.workflow_name) AS served_versions
   FROM runledger.runs r
  WHERE (status = ANY (ARRAY['PENDING'::runledger.run_status, 'WAITING'::runledger.run_status])) AND NOT (EXISTS ( SELECT 1
           FROM runledger.live_workers w
          WHERE ((r.workflow_name || '@'::text) || r.workflow_version) = ANY (w.workflows)));
COMMENT ON VIEW runledger.stranded_runs IS 'PENDING and WAITING runs whose (workflow, version) no live worker serves: they wait for a worker of their version (or a migration), and are never failed by the engine for it. served_versions: the versions of the same workflow live workers do serve.';

CREATE VIEW runledger.streams AS
 SELECT c.run_id,
    c.topic,
    c.chunks,
    c.next_offset,
    c.last_write_at,
    e.run_id IS NOT NULL AS closed,
    e.end_offset,
    e.closed_at
   FROM ( SELECT s.run_id,
            s.topic,
            count(*) AS chunks,
            max(s."offset") + 1 AS next_offset,
            max(s.created_at) AS last_write_at
           FROM runledger.stream_chunks s
          GROUP BY s.run_id, s.topic) c
     LEFT JOIN runledger.stream_ends e ON e.run_id = c.run_id AND e.topic = c.topic
UNION ALL
 SELECT e.run_id,
    e.topic,
    0 AS chunks,
    0 AS next_offset,
    NULL::timestamp with time zone AS last_write_at,
    true AS closed,
    e.end_offset,
    e.closed_at
   FROM runledger.stream_ends e
  WHERE NOT (EXISTS ( SELECT 1
           FROM runledger.stream_chunks s
          WHERE s.run_id = e.run_id AND s.topic = e.topic));
COMMENT ON VIEW runledger.streams IS 'Each durable stream of each run: chunks stored, next_offset (the offset after the last chunk), when it was last written, and whether it is closed (end_offset, closed_at). Filter by run_id: select * from runledger.streams where run_id = ''...''.';

CREATE VIEW runledger.unknown_operations AS
 SELECT o.operation_id,
    o.run_id,
    r.workflow_name,
    o.name,
    o.idempotency_key,
    o.attempts,
    o.started_at,
    o.updated_at AS unknown_since,
    runledger.now() - o.updated_at AS unknown_for,
    r.status AS run_status,
    r.wait_kind
   FROM runledger.operations o
     JOIN runledger.runs r ON r.run_id = o.run_id
  WHERE o.status = 'UNKNOWN'::text;
COMMENT ON VIEW runledger.unknown_operations IS 'External operations whose outcome is UNKNOWN (the worker died between the call and recording its result): which run, since when, with which idempotency key. Settle one with select runledger.resolve_operation(operation_id, ''SUCCEEDED''|''FAILED'', result).';

CREATE VIEW runledger.version_stats AS
 SELECT s.workflow_name,
    s.workflow_version,
    s.runtime,
    sum(s.n)::bigint AS runs,
    COALESCE(sum(s.n) FILTER (WHERE s.status = ANY (ARRAY['PENDING'::text, 'RUNNING'::text, 'WAITING'::text, 'CANCELLING'::text])), 0::numeric)::bigint AS active,
    jsonb_object_agg(s.status, s.n) AS statuses,
    min(s.oldest_waiting) AS oldest_waiting_since,
    lw.live_workers
   FROM ( SELECT r.workflow_name,
            r.workflow_version,
            r.version_manifest ->> 'runtime'::text AS runtime,
            r.status::text AS status,
            count(*) AS n,
            min(r.created_at) FILTER (WHERE r.status = ANY (ARRAY['PENDING'::runledger.run_status, 'WAITING'::runledger.run_status])) AS oldest_waiting
           FROM runledger.runs r
          GROUP BY r.workflow_name, r.workflow_version, (r.version_manifest ->> 'runtime'::text), (r.status::text)) s
     CROSS JOIN LATERAL ( SELECT count(*) AS live_workers
           FROM runledger.live_workers w
          WHERE ((s.workflow_name || '@'::text) || s.workflow_version) = ANY (w.workflows)) lw
  GROUP BY s.workflow_name, s.workflow_version, s.runtime, lw.live_workers;
COMMENT ON VIEW runledger.version_stats IS 'Runs per (workflow, version, runtime version): how many, how many are still active, the count per status, the oldest PENDING or WAITING run, and how many live workers serve that version. A version with no active runs can be retired; one with active runs and no live worker has stranded runs.';

CREATE VIEW runledger.waiting AS
 SELECT r.run_id,
    r.workflow_name,
    r.queue_name,
    r.wait_kind,
        CASE r.wait_kind
            WHEN 'signal'::text THEN 'signal '::text || r.wait_key
            WHEN 'approval'::text THEN 'approval '::text || r.wait_key
            WHEN 'child'::text THEN 'child run '::text || r.wait_key
            WHEN 'timer'::text THEN 'timer'::text
            ELSE r.wait_kind
        END AS waiting_for,
    s.name AS step_name,
    s.seq AS step_seq,
    s.started_at AS since,
    r.wake_at AS until,
    r.deadline_at,
    runledger.now() - s.started_at AS waited
   FROM runledger.runs r
     LEFT JOIN LATERAL ( SELECT st.name,
            st.seq,
            st.started_at
           FROM runledger.steps st
          WHERE st.run_id = r.run_id AND st.status = 'WAITING'::text
          ORDER BY st.seq DESC
         LIMIT 1) s ON true
  WHERE r.status = 'WAITING'::runledger.run_status;
COMMENT ON VIEW runledger.waiting IS 'Runs waiting, holding no worker: what for (timer, signal topic, approval request, child run), at which step, since when and until when (timeout or deadline).';

CREATE VIEW runledger.workflow_world_runs AS
 SELECT w.run_id,
    w.workflow_name,
    w.status,
    w.deployment_id,
    w.created_at,
    w.started_at,
    w.completed_at,
    w.error_code,
    w.attributes,
    ( SELECT count(*)::integer AS count
           FROM runledger.wf_steps s
          WHERE s.run_id = w.run_id) AS steps,
    ( SELECT count(*)::integer AS count
           FROM runledger.wf_hooks h
          WHERE h.run_id = w.run_id) AS live_hooks,
    ( SELECT count(*)::integer AS count
           FROM runledger.wf_waits t
          WHERE t.run_id = w.run_id AND t.status = 'waiting'::text) AS waiting_sleeps,
    d.deliveries,
    d.deliveries_active,
    d.deliveries_failed,
    d.last_delivery_run_id
   FROM runledger.wf_runs w
     LEFT JOIN LATERAL ( SELECT count(*)::integer AS deliveries,
            count(*) FILTER (WHERE r.status = ANY (ARRAY['PENDING'::runledger.run_status, 'RUNNING'::runledger.run_status, 'WAITING'::runledger.run_status]))::integer AS deliveries_active,
            count(*) FILTER (WHERE r.status = ANY (ARRAY['FAILED'::runledger.run_status, 'DEAD_LETTER'::runledger.run_status]))::integer AS deliveries_failed,
            (array_agg(r.run_id ORDER BY r.created_at DESC))[1] AS last_delivery_run_id
           FROM runledger.runs r
          WHERE r.workflow_name = 'workflow-world'::text AND (r.input ->> 'runId'::text) = w.run_id) d ON true;
COMMENT ON VIEW runledger.workflow_world_runs IS 'One row per Workflow SDK run (runledger/workflow-world): its status and workflow, its steps, live hooks and pending sleeps, and the runledger runs that delivered its queue messages (how many, still active, failed or dead-lettered, the latest one''s run_id for runledger.runs and the console).';

-- functions

CREATE OR REPLACE FUNCTION runledger._add_amounts(p_a jsonb, p_b jsonb)
 RETURNS jsonb
 LANGUAGE sql
 IMMUTABLE
AS $function$
  select coalesce(jsonb_object_agg(k, coalesce((p_a->>k)::numeric, 0) + coalesce((p_b->>k)::numeric, 0)), '{}'::jsonb)
    from (select jsonb_object_keys(coalesce(p_a, '{}'::jsonb)) union select jsonb_object_keys(coalesce(p_b, '{}'::jsonb))) keys(k)
$function$;
COMMENT ON FUNCTION runledger._add_amounts(jsonb,jsonb) IS 'The sum per key of two objects of numbers (budget amounts); a key missing on one side counts 0.';

CREATE OR REPLACE FUNCTION runledger._admit(p_queue text, p_max integer DEFAULT 1000)
 RETURNS integer
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
declare
  v_count int;
begin
  -- Found by run_id, with no status in the condition: `status = 'PENDING' and not admitted`
  -- would prove the predicate of runs_admission_key and runs_admission_order, and a plan
  -- cached while the table was empty walked runs_admission_key for each run
  -- (test/plans.slow.test.ts, PostgreSQL 17).
  update runledger.runs r
     set admitted = true, admitted_at = c.admitted_at
    from runledger._admit_round(p_queue, p_max) c
   where r.run_id = c.run_id and not r.admitted;
  get diagnostics v_count = row_count;
  return v_count;
end;
$function$;
COMMENT ON FUNCTION runledger._admit(text,integer) IS 'Admission for one queue: an _admit_round, its runs written admitted with the admitted_at the round gave each. Returns how many it admitted.';

CREATE OR REPLACE FUNCTION runledger._admit_all(p_limit integer DEFAULT 1000)
 RETURNS integer
 LANGUAGE sql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
  -- Sweeper: rate-limit windows that opened, and queues whose limits were raised.
  select coalesce(sum(runledger._admit(q.name, p_limit)), 0)::int
    from runledger.queues q
   where not q.paused
     and exists (select 1 from runledger.runs r where r.queue_name = q.name and r.status = 'PENDING' and not r.admitted)
$function$;
COMMENT ON FUNCTION runledger._admit_all(integer) IS 'Sweeper: runs admission for every queue with runs waiting for it (a rate-limit window that opened, a raised limit). Returns how many runs it admitted.';

CREATE OR REPLACE FUNCTION runledger._admit_deferred(p_deferred jsonb)
 RETURNS void
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
begin
  if p_deferred is null or jsonb_array_length(p_deferred) = 0 then
    return;
  end if;
  -- `admitted is not true` rather than `not admitted`, so that no plan walks
  -- runs_admission_key for each run (see _admit).
  update runledger.runs r
     set admitted = true, admitted_at = d.at
    from jsonb_to_recordset(p_deferred) d(id text, at timestamptz)
   where r.run_id = d.id and r.status = 'PENDING' and r.admitted is not true;
end;
$function$;
COMMENT ON FUNCTION runledger._admit_deferred(jsonb) IS 'The end of _commit_and_claim: admits the runs its admission rounds chose (p_deferred, [{q, id, at}], from _admit_queues) and its claim did not take, with the admitted_at each round gave them.';

CREATE OR REPLACE FUNCTION runledger._admit_first_turns(p_queue text, p_free integer, p_now timestamp with time zone)
 RETURNS text[]
 LANGUAGE plpgsql
 STABLE
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
declare
  v_ids text[];
begin
  if p_free is null or p_free < 1 then
    return null;
  end if;
  with oldest as materialized (
    select r.run_id, coalesce(r.concurrency_key, '') as k, r.priority, r.created_at
      from runledger.runs r
     where r.queue_name = p_queue and r.status = 'PENDING' and not r.admitted
       and (r.not_before is null or r.not_before <= p_now)
     order by r.priority, r.created_at, r.run_id
     limit 4 * p_free + 32),
  heads as (
    select distinct on (o.k) o.run_id, o.k, o.priority, o.created_at
      from oldest o
     order by o.k, o.priority, o.created_at, o.run_id),
  busy as (
    select distinct coalesce(r.concurrency_key, '') as k from runledger.runs r
     where r.queue_name = p_queue and (r.status in ('RUNNING', 'CANCELLING') or (r.status = 'PENDING' and r.admitted)))
  select array_agg(f.run_id order by f.created_at, f.run_id) into v_ids
    from (select h.run_id, h.created_at from heads h
           where h.priority = (select min(o.priority) from oldest o)
             and not exists (select 1 from busy b where b.k = h.k)
           order by h.created_at, h.run_id
           limit p_free) f;
  if coalesce(cardinality(v_ids), 0) < p_free then
    return null;
  end if;
  return v_ids;
end;
$function$;
COMMENT ON FUNCTION runledger._admit_first_turns(text,integer,timestamp with time zone) IS 'Part of _admit: the p_free runs an admission round of p_queue takes, in its order, when they are all first turns of the smallest priority waiting (heads of keys with no run in a slot) found among the queue''s 4 × p_free + 32 oldest due waiting runs (index runs_admission_order); null when those do not settle the round. Reads only; the caller holds the queue''s row lock.';

CREATE OR REPLACE FUNCTION runledger._admit_queues(p_queues text[], p_defer boolean DEFAULT false)
 RETURNS jsonb
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
declare
  v_queue    text;
  v_deferred jsonb := '[]';
begin
  if coalesce(cardinality(p_queues), 0) = 0 then
    return case when p_defer then '[]'::jsonb end;
  end if;
  for v_queue in select distinct q from unnest(p_queues) q where runledger._queue_limited(q) order by q loop
    if p_defer then
      v_deferred := v_deferred || coalesce((select jsonb_agg(jsonb_build_object('q', v_queue, 'id', c.run_id, 'at', c.admitted_at))
                                              from runledger._admit_round(v_queue) c), '[]');
    else
      perform runledger._admit(v_queue);
    end if;
  end loop;
  return case when p_defer then v_deferred end;
end;
$function$;
COMMENT ON FUNCTION runledger._admit_queues(text[],boolean) IS 'The end of a batch: an admission round for each queue of p_queues that has limits, in name order, so that concurrent batches lock the queues in the same order. With p_defer (a group commit with a claim, _commit_and_claim) the rounds'' runs are not written: they are returned as [{q, id, at}] for the claim (_claim_batch''s p_deferred) and for _admit_deferred; otherwise null.';

CREATE OR REPLACE FUNCTION runledger._admit_round(p_queue text, p_max integer DEFAULT 1000)
 RETURNS TABLE(run_id text, admitted_at timestamp with time zone)
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
declare
  v_q      runledger.queues;
  v_now    timestamptz := runledger.now();
  v_active int;
  v_free   int := p_max;
  v_recent int;
  v_count  int := 0;
  v_first  text[];
begin
  -- One admitter per queue at a time: the count below and the admissions after it are
  -- then consistent, whatever number of workers and starts run concurrently.
  select * into v_q from runledger.queues where name = p_queue for update;
  if not found or v_q.paused then
    return;
  end if;
  if v_q.concurrency is not null then
    select count(*) into v_active from runledger.runs r
     where r.queue_name = p_queue and (r.status in ('RUNNING', 'CANCELLING') or (r.status = 'PENDING' and r.admitted));
    v_free := least(v_free, v_q.concurrency - v_active);
  end if;
  if v_q.rate_limit_max is not null then
    delete from runledger.admissions a
     where a.queue_name = p_queue and a.admitted_at <= v_now - make_interval(secs => v_q.rate_limit_period_ms / 1000.0);
    select count(*) into v_recent from runledger.admissions a where a.queue_name = p_queue;
    v_free := least(v_free, v_q.rate_limit_max - v_recent);
  end if;
  if v_free <= 0 then
    return;
  end if;

  -- A round with few free slots is most often settled by the queue's oldest waiting runs
  -- (_admit_first_turns); past 64 slots the shortcut would read too many of them to pay.
  if v_free <= 64 then
    v_first := runledger._admit_first_turns(p_queue, v_free, v_now);
  end if;
  if v_first is null then
    -- One statement for the whole round, in the order (priority, turn, age), where a run's
    -- turn is its place among its key's waiting runs after the ones that key already has
    -- running: ordering by turn interleaves keys, so a tenant with a burst of 50,000 runs
    -- cannot starve one with 10. Each key's first due run (its head) is found by a skip
    -- scan over runs_admission_key, one index probe per key, whatever the backlog. A key's
    -- later runs come after its head in (priority, turn), so they are read only for the
    -- keys whose next turn could still place among the round's v_free best heads; with
    -- many keys and few free slots that is none of them. (Null key counts as ''.)
    with recursive heads(k, run_id, priority, created_at) as (
      (select coalesce(r.concurrency_key, ''), r.run_id, r.priority, r.created_at from runledger.runs r
        where r.queue_name = p_queue and r.status = 'PENDING' and not r.admitted
          and (r.not_before is null or r.not_before <= v_now)
        order by coalesce(r.concurrency_key, ''), r.priority, r.created_at, r.run_id
        limit 1)
      union all
      select n.* from heads h cross join lateral (
        select coalesce(r.concurrency_key, ''), r.run_id, r.priority, r.created_at from runledger.runs r
         where r.queue_name = p_queue and r.status = 'PENDING' and not r.admitted
           and (r.not_before is null or r.not_before <= v_now)
           and coalesce(r.concurrency_key, '') > h.k
         order by coalesce(r.concurrency_key, ''), r.priority, r.created_at, r.run_id
         limit 1) n),
    active as (
      select coalesce(r.concurrency_key, '') as k, count(*) as n from runledger.runs r
       where r.queue_name = p_queue and (r.status in ('RUNNING', 'CANCELLING') or (r.status = 'PENDING' and r.admitted))
       group by 1),
    ranked as (
      -- Each head's turn, and how many of its key's runs this round may take at most.
      select h.*, coalesce(a.n, 0) + 1 as turn,
             least(v_free, greatest(coalesce(v_q.per_key_concurrency - coalesce(a.n, 0), v_free), 0)) as room
        from heads h left join active a on a.k = h.k),
    bar as (
      -- The v_free-th best head: a later run of a key places in the round only if its
      -- (priority, turn) is at most this one's. None when there are fewer heads than slots.
      select b.priority, b.turn from ranked b where b.room > 0
       order by b.priority, b.turn, b.created_at, b.run_id offset v_free - 1 limit 1),
    candidates as (
      select k.run_id, k.priority, k.turn, k.created_at from ranked k where k.room > 0
      union all
      select c.run_id, c.priority, k.turn + c.behind as turn, c.created_at
        from ranked k
        cross join lateral (
          select r.run_id, r.priority, r.created_at,
                 row_number() over (order by r.priority, r.created_at, r.run_id) as behind
            from runledger.runs r
           where r.queue_name = p_queue and r.status = 'PENDING' and not r.admitted
             and coalesce(r.concurrency_key, '') = k.k and (r.not_before is null or r.not_before <= v_now)
             and (r.priority, r.created_at, r.run_id) > (k.priority, k.created_at, k.run_id)
           order by r.priority, r.created_at, r.run_id
           limit k.room - 1) c
       where k.room > 1
         and not exists (select 1 from bar where (k.priority, k.turn + 1) > (bar.priority, bar.turn))),
    chosen as (
      select c.run_id, row_number() over (order by c.priority, c.turn, c.created_at, c.run_id) as ord
        from candidates c
       where v_q.per_key_concurrency is null or c.turn <= v_q.per_key_concurrency
       order by c.priority, c.turn, c.created_at, c.run_id
       limit v_free)
    select coalesce(array_agg(ch.run_id order by ch.ord), '{}') into v_first from chosen ch;
  end if;
  v_count := cardinality(v_first);
  if v_count > 0 then
    perform runledger._dispatch(null, p_queue); -- one announcement for the round
    if v_q.rate_limit_max is not null then
      insert into runledger.admissions (queue_name, admitted_at) select p_queue, v_now from generate_series(1, v_count);
    end if;
  end if;
  -- One microsecond apart, in the round's order: workers claim admitted runs by
  -- admitted_at, so a claim smaller than this round keeps its fairness.
  return query select f.run_id, v_now + (f.ord - 1) * interval '1 microsecond'
                 from unnest(v_first) with ordinality f(run_id, ord) order by f.ord;
end;
$function$;
COMMENT ON FUNCTION runledger._admit_round(text,integer) IS 'An admission round for one queue, under its row lock (held to the end of the transaction): the PENDING runs that fill its free slots (concurrency, per-key concurrency, rate limit; none when paused) by priority (lower first), then fair turns across concurrency keys, then age, each with the admitted_at that keeps that order. Work-conserving. Records the round in admissions (a rate-limited queue) and dispatches it, but leaves the runs as they are: _admit writes them admitted; a group commit with a claim (_commit_and_claim) hands them to its claim first. A round of at most 64 free slots first tries _admit_first_turns (the oldest waiting runs); otherwise, or when those do not settle it, it reads the head of every key with runs waiting.';

CREATE OR REPLACE FUNCTION runledger._announce_finished(p_run_ids text[])
 RETURNS void
 LANGUAGE plpgsql
AS $function$
declare
  v_chunk text := '';
  v_id    text;
begin
  foreach v_id in array p_run_ids loop
    if length(v_chunk) + length(v_id) + 1 > 7900 then
      perform pg_notify('runledger_finished', v_chunk);
      v_chunk := '';
    end if;
    v_chunk := case when v_chunk = '' then v_id else v_chunk || ',' || v_id end;
  end loop;
  if v_chunk <> '' then
    perform pg_notify('runledger_finished', v_chunk);
  end if;
end;
$function$;
COMMENT ON FUNCTION runledger._announce_finished(text[]) IS 'NOTIFY runledger_finished with the ids of runs that reached a terminal status, comma-separated, split to stay under the 8,000-byte payload limit; callers awaiting results listen for it.';

CREATE OR REPLACE FUNCTION runledger._apply_migration(p_run_id text, p_to_version text, p_input jsonb, p_checkpoints jsonb, p_manifest jsonb, p_worker_id text)
 RETURNS runledger.run_status
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_run     runledger.runs;
  v_before  jsonb;
  v_wait    runledger.steps;
  v_kept    int;
  v_status  runledger.run_status;
  v_old_len int;
  v_bound   int;
  v_prefix  int;
begin
  select * into v_run from runledger.runs where run_id = p_run_id for update;
  if not found or v_run.migrate_to is distinct from p_to_version or not runledger._migratable(v_run.status) then
    raise exception using errcode = 'RL005',
      message = format('_apply_migration: run %s is not marked for a migration to %s, or no longer PENDING, WAITING or DEAD_LETTER', p_run_id, p_to_version);
  end if;
  select coalesce(jsonb_agg(jsonb_build_object('seq', s.seq, 'name', s.name, 'kind', s.kind, 'status', s.status) order by s.seq), '[]')
    into v_before from runledger.steps s where s.run_id = p_run_id;
  if p_checkpoints is not null then
    if jsonb_typeof(p_checkpoints) <> 'array' then
      raise exception using errcode = 'RL003', message = '_apply_migration: checkpoints must be a JSON array';
    end if;
    -- A waiting run keeps the position of its wait: its wake-up (signal, approval, timer) is bound to it.
    if v_run.status = 'WAITING' then
      select * into v_wait from runledger.steps s where s.run_id = p_run_id and s.status = 'WAITING';
      if found and not coalesce((p_checkpoints->v_wait.seq->>'name') = v_wait.name
                                and (p_checkpoints->v_wait.seq->>'status') = 'WAITING'
                                and jsonb_array_length(p_checkpoints) = v_wait.seq + 1, false) then
        raise exception using errcode = 'RL003',
          message = format('_apply_migration: run %s waits at step %s (%s %s); a migration of a waiting run keeps that wait as its last checkpoint, at the same position',
                           p_run_id, v_wait.seq, v_wait.kind, v_wait.name);
      end if;
    end if;
    -- Other records name step positions: the operation ledger, approvals, consumed signals,
    -- stream chunks, session entries, artifacts. Their positions keep their checkpoints (names
    -- and kinds; outputs may change), so the new code meets them where they were made.
    select count(*) into v_old_len from runledger.steps s where s.run_id = p_run_id;
    select greatest((select max(o.seq) from runledger.operations o where o.run_id = p_run_id),
                    (select max(a.seq) from runledger.approvals a where a.run_id = p_run_id),
                    (select max(g.consumed_seq) from runledger.signals g where g.run_id = p_run_id),
                    (select max(c.seq) from runledger.stream_chunks c where c.run_id = p_run_id),
                    (select max(e.step_position) from runledger.session_entries e where e.run_id = p_run_id),
                    (select max(f.step_position) from runledger.artifacts f where f.run_id = p_run_id))
      into v_bound;
    if v_bound is not null then
      v_prefix := least(v_bound + 1, v_old_len);
      if jsonb_array_length(p_checkpoints) < v_prefix
         or (v_bound >= v_old_len and jsonb_array_length(p_checkpoints) <> v_old_len)
         or exists (select 1 from runledger.steps s
                     where s.run_id = p_run_id and s.seq < v_prefix
                       and ((p_checkpoints->s.seq->>'name') is distinct from s.name
                            or coalesce(p_checkpoints->s.seq->>'kind', 'step') is distinct from s.kind)) then
        raise exception using errcode = 'RL003',
          message = format('_apply_migration: run %s has records tied to step positions up to %s (operations, approvals, signals, streams, session entries or artifacts); a migration keeps its checkpoints 0..%s with their names and kinds (their outputs may change)%s',
                           p_run_id, v_bound, v_prefix - 1,
                           case when v_bound >= v_old_len then ', and adds none after them' else '' end);
      end if;
    end if;
    delete from runledger.steps s where s.run_id = p_run_id;
    insert into runledger.steps (run_id, seq, name, kind, status, output, error, attempts, started_at, finished_at, fencing_token)
    select p_run_id, (c.ord - 1)::int, c.item->>'name', coalesce(c.item->>'kind', 'step'), coalesce(c.item->>'status', 'SUCCEEDED'),
           case when jsonb_typeof(c.item->'output') = 'array' then c.item->'output'->0 end, case when c.item->'error' = 'null'::jsonb then null else c.item->'error' end,
           1, runledger.now(), runledger.now(), v_run.fencing_token
      from jsonb_array_elements(p_checkpoints) with ordinality as c(item, ord);
    -- Heartbeat progress of positions that hold no checkpoint now belonged to the old code.
    delete from runledger.step_progress p
     where p.run_id = p_run_id and p.seq >= jsonb_array_length(p_checkpoints);
  end if;
  select count(*) into v_kept from runledger.steps s where s.run_id = p_run_id;

  v_status := case when v_run.status = 'DEAD_LETTER' then 'PENDING'::runledger.run_status else v_run.status end;
  update runledger.runs
     set workflow_version = p_to_version, migrate_to = null,
         input = coalesce(p_input, input),
         version_manifest = coalesce(p_manifest, '{}') || jsonb_build_object('migrated_from', v_run.workflow_version),
         status = v_status, updated_at = runledger.now(),
         -- A dead-lettered run comes back as retry_run brings it back.
         error = case when v_run.status = 'DEAD_LETTER' then null else error end,
         finished_at = case when v_run.status = 'DEAD_LETTER' then null else finished_at end,
         recovery_attempts = case when v_run.status = 'DEAD_LETTER' then 0 else recovery_attempts end,
         termination_reason = case when v_run.status = 'DEAD_LETTER' then null else termination_reason end,
         termination_evidence = case when v_run.status = 'DEAD_LETTER' then null else termination_evidence end,
         terminated_at = case when v_run.status = 'DEAD_LETTER' then null else terminated_at end
   where run_id = p_run_id;
  insert into runledger.events (run_id, kind, detail, fencing_token)
  values (p_run_id, 'migrated', jsonb_strip_nulls(jsonb_build_object(
            'from_version', v_run.workflow_version, 'to_version', p_to_version, 'worker', p_worker_id,
            'previous_status', v_run.status, 'status', v_status,
            'manifest_before', v_run.version_manifest, 'manifest_after', coalesce(p_manifest, '{}'),
            'input_changed', p_input is not null and p_input is distinct from v_run.input,
            'checkpoints_before', v_before, 'checkpoints_kept', v_kept,
            'termination_reason', v_run.termination_reason, 'termination_evidence', v_run.termination_evidence)),
          v_run.fencing_token);
  if v_run.status = 'DEAD_LETTER' then
    -- Back in the automatic path, through admission like any run that becomes PENDING.
    perform runledger._make_runnable(p_run_id, 0);
  elsif v_run.status = 'PENDING' and v_run.admitted then
    -- Already admitted (its queue slot and rate admission stay as they were): only the
    -- new version's workers are told, so they claim it at once.
    perform runledger._dispatch(p_run_id, v_run.queue_name);
  end if;
  return v_status;
end;
$function$;
COMMENT ON FUNCTION runledger._apply_migration(text,text,jsonb,jsonb,jsonb,text) IS 'A worker''s migrator, in the transaction of _take_migration: moves the run to to_version with the input (null: unchanged), the checkpoints (null: unchanged; else they replace the history, positions 0..n-1, each {name, kind, status, output: [value] or null, error}) and the new version''s manifest the workflow''s migrate produced; records the event migrated with both manifests. A DEAD_LETTER run becomes PENDING; a WAITING one must keep its wait as its last checkpoint.';

CREATE OR REPLACE FUNCTION runledger._approval_votes(p_request_id text)
 RETURNS jsonb
 LANGUAGE sql
 STABLE
AS $function$
  select coalesce(jsonb_agg(jsonb_build_object('decidedBy', v.voter, 'approved', v.approved, 'note', v.note, 'decidedAt', v.decided_at)
                            order by v.decided_at, v.voter), '[]')
    from runledger.approval_votes v where v.request_id = p_request_id
$function$;
COMMENT ON FUNCTION runledger._approval_votes(text) IS 'The decisions on a request, in order, as the waiting run receives them (decidedBy, approved, note, decidedAt).';

CREATE OR REPLACE FUNCTION runledger._artifact_blob_held(p_sha256 text)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
begin
  -- FOR KEY SHARE keeps the blob from prune_artifact_blobs until this transaction ends,
  -- so the row recorded next can refer to it without sending the content again.
  perform 1 from runledger.artifact_blobs b where b.sha256 = p_sha256 for key share;
  return found;
end;
$function$;
COMMENT ON FUNCTION runledger._artifact_blob_held(text) IS 'True when content with this sha256 is stored, and then kept from deletion until the caller''s transaction ends (the caller records a row referring to it without sending the content).';

CREATE OR REPLACE FUNCTION runledger._as_charge(p_charge jsonb)
 RETURNS jsonb
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
  -- A bare number is a charge of units (as ctx.charge(12) was before dimensions).
  select case when jsonb_typeof(p_charge) = 'number' then jsonb_build_object('units', p_charge) else p_charge end
$function$;
COMMENT ON FUNCTION runledger._as_charge(jsonb) IS 'A charge as an object of dimensions: a bare number is {"units": n}.';

CREATE OR REPLACE FUNCTION runledger._audit(p_action text, p_run_id text, p_target text, p_arguments jsonb, p_result jsonb, p_asserted_by text DEFAULT NULL::text)
 RETURNS void
 LANGUAGE sql
AS $function$
  insert into runledger.audit_log (action, run_id, target, arguments, result, asserted_by)
  values (p_action, p_run_id, p_target, jsonb_strip_nulls(coalesce(p_arguments, '{}')), p_result, p_asserted_by)
$function$;
COMMENT ON FUNCTION runledger._audit(text,text,text,jsonb,jsonb,text) IS 'Records one operator action in runledger.audit_log (the caller''s login and role are taken from session_user and runledger._caller()).';

CREATE OR REPLACE FUNCTION runledger._audit_log_min_keep()
 RETURNS interval
 LANGUAGE sql
 STABLE
AS $function$
  select coalesce((select s.audit_log_min_keep from runledger.owner_settings s), interval '365 days')
$function$;
COMMENT ON FUNCTION runledger._audit_log_min_keep() IS 'How long the audit log is kept at least: owner_settings.audit_log_min_keep (365 days when the row is missing). set_retention refuses a shorter audit_log rule; prune_due never removes a younger record.';

CREATE OR REPLACE FUNCTION runledger._base32_10(p bigint)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
AS $function$
  select substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((p >> 45) & 31)::int + 1, 1)
      || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((p >> 40) & 31)::int + 1, 1)
      || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((p >> 35) & 31)::int + 1, 1)
      || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((p >> 30) & 31)::int + 1, 1)
      || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((p >> 25) & 31)::int + 1, 1)
      || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((p >> 20) & 31)::int + 1, 1)
      || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((p >> 15) & 31)::int + 1, 1)
      || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((p >> 10) & 31)::int + 1, 1)
      || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((p >> 5) & 31)::int + 1, 1)
      || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', (p & 31)::int + 1, 1)
$function$;
COMMENT ON FUNCTION runledger._base32_10(bigint) IS 'The low 50 bits of p as 10 Crockford base32 characters (inlined into its caller: a ULID''s time part, or with right(..., 8) 40 of its random bits).';

CREATE OR REPLACE FUNCTION runledger._caller()
 RETURNS text
 LANGUAGE sql
 STABLE PARALLEL SAFE
AS $function$
  -- The role the caller acts as. current_user is the function's owner inside a SECURITY
  -- DEFINER function (every public action is one, 0014_security.sql); the setting `role`
  -- keeps what SET ROLE chose, and is 'none' when the login acts as itself.
  select case when current_setting('role') = 'none' then session_user::text else current_setting('role') end
$function$;
COMMENT ON FUNCTION runledger._caller() IS 'The role the calling session acts as (SET ROLE''s role, else the login), also inside SECURITY DEFINER functions where current_user is the owner. Recorded as db_role in audit_log, approvals and approval_votes, and checked against role approvers.';

CREATE OR REPLACE FUNCTION runledger._cancel_children(p_run_id text, p_reason text)
 RETURNS integer
 LANGUAGE plpgsql
AS $function$
declare
  v_child text;
  v_count int := 0;
begin
  for v_child in
    select r.run_id from runledger.runs r
     where r.parent_run_id = p_run_id and not runledger.is_terminal(r.status)
  loop
    perform runledger._cancel_run(v_child, p_reason);
    v_count := v_count + 1;
  end loop;
  return v_count;
end;
$function$;
COMMENT ON FUNCTION runledger._cancel_children(text,text) IS 'Cancels every unfinished child run of p_run_id (and, through cancel_run, theirs). Returns how many.';

CREATE OR REPLACE FUNCTION runledger._cancel_run(p_run_id text, p_reason text DEFAULT NULL::text)
 RETURNS text
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
declare
  v_run runledger.runs;
  v_now timestamptz := runledger.now();
begin
  select * into v_run from runledger.runs where run_id = p_run_id for update;
  if not found then
    raise exception using errcode = 'RL002', message = format('cancel_run: run %L not found', p_run_id);
  end if;
  if runledger.is_terminal(v_run.status) or v_run.status = 'CANCELLING' then
    return v_run.status; -- nothing to do: the answer is where the run stands
  end if;
  if v_run.status in ('PENDING', 'WAITING') and not runledger._compensations_due(p_run_id) then
    perform runledger._stop_unowned(p_run_id, 'CANCELLED', 'CANCELLED',
      jsonb_build_object('reason', p_reason, 'requested_at', v_now, 'was', v_run.status));
    return 'CANCELLED';
  end if;
  if v_run.status in ('PENDING', 'WAITING') then
    -- It did things that must be undone: a worker takes it (still CANCELLING) to run the
    -- compensations, then ends it CANCELLED. No step of its own runs again.
    update runledger.runs
       set status = 'CANCELLING', cancel_requested_at = v_now, cancel_reason = p_reason, updated_at = v_now,
           wait_kind = null, wait_key = null, wake_at = null
     where run_id = p_run_id;
    insert into runledger.events (run_id, kind, detail, at)
    values (p_run_id, 'cancel_requested', jsonb_build_object('reason', p_reason, 'compensations', true, 'was', v_run.status), v_now);
    perform runledger._cancel_children(p_run_id, format('parent %s cancelled', p_run_id));
    perform runledger._dispatch(p_run_id, v_run.queue_name);
    return 'CANCELLING';
  end if;
  -- RUNNING: the owner is told now (NOTIFY) and at its next checkpoint at the latest; it
  -- stops starting steps, lets the step in flight record its result, and ends the run.
  update runledger.runs
     set status = 'CANCELLING', cancel_requested_at = v_now, cancel_reason = p_reason, updated_at = v_now
   where run_id = p_run_id;
  insert into runledger.events (run_id, kind, detail, fencing_token, at)
  values (p_run_id, 'cancel_requested', jsonb_build_object('reason', p_reason, 'owner', v_run.lease_owner), v_run.fencing_token, v_now);
  perform runledger._cancel_children(p_run_id, format('parent %s cancelled', p_run_id));
  perform pg_notify('runledger_cancel', p_run_id);
  return 'CANCELLING';
end;
$function$;
COMMENT ON FUNCTION runledger._cancel_run(text,text) IS 'The action behind runledger.cancel_run (which records it in audit_log): Cancels a run: PENDING or WAITING -> CANCELLED at once (timers, dispatches revoked), or CANCELLING when it has compensations to run (a worker runs them); RUNNING -> CANCELLING, its worker is notified and ends it CANCELLED after the step in flight. Children are cancelled too. A finished run is left as it is. Returns the run''s new status.';

CREATE OR REPLACE FUNCTION runledger._charge(p_run runledger.runs, p_charge jsonb, p_step text, p_seq integer)
 RETURNS runledger.runs
 LANGUAGE plpgsql
AS $function$
declare
  v_run    runledger.runs;
  v_charge jsonb := runledger._as_charge(p_charge);
  v_units  numeric := coalesce((v_charge->>'units')::numeric, 0);
  v_other  jsonb := v_charge - 'units';
  v_dim    text;
  v_limit  numeric;
  v_spent  numeric;
  v_evidence jsonb;
  v_session  jsonb;
begin
  -- units stay in budget_spent; the other dimensions add up in budget_used.
  update runledger.runs r
     set budget_spent = r.budget_spent + v_units,
         budget_used = case when v_other = '{}'::jsonb then r.budget_used
                            else runledger._add_amounts(r.budget_used, v_other) end
   where r.run_id = p_run.run_id
  returning * into v_run;
  if v_run.budget is not null and v_run.budget_spent > v_run.budget then
    v_dim := 'units';
    v_evidence := jsonb_build_object('dimension', 'units', 'limit', v_run.budget, 'budget', v_run.budget, 'spent', v_run.budget_spent,
                                     'charge', v_units, 'step', p_step, 'seq', p_seq);
  else
    -- The first dimension (in a fixed order) past its limit names the stop.
    foreach v_dim in array array['tokens', 'cost_usd', 'tool_calls', 'turns'] loop
      v_limit := (v_run.budget_limits->>v_dim)::numeric;
      v_spent := coalesce((v_run.budget_used->>v_dim)::numeric, 0);
      if v_limit is not null and v_spent > v_limit then
        v_evidence := jsonb_build_object('dimension', v_dim, 'limit', v_limit, 'spent', v_spent, 'budget_used', v_run.budget_used,
                                         'charge', coalesce((v_other->>v_dim)::numeric, 0), 'step', p_step, 'seq', p_seq);
        exit;
      end if;
    end loop;
  end if;
  if v_evidence is null then
    return v_run;
  end if;
  -- The limit passed is a session's cap (a session budget), not the run's own: say which.
  select jsonb_build_object('session_id', s.session_id, 'budget', s.budget_limits->(v_dim),
                            'spent_before', coalesce((s.budget_used->>v_dim)::numeric, 0))
    into v_session
    from runledger.sessions s
   where s.holder_run_id = v_run.run_id and s.holder_mark is not null
     and (s.holder_mark->'cap'->>v_dim)::numeric = (v_evidence->>'limit')::numeric
     and (s.holder_mark->'base'->>v_dim) is distinct from (v_evidence->>'limit')
   order by s.session_id limit 1;
  if v_session is not null then
    v_evidence := v_evidence || jsonb_build_object('session', v_session);
  end if;
  perform runledger._terminate_run(v_run.run_id, v_run.fencing_token, 'BUDGET', v_evidence);
  select * into v_run from runledger.runs where run_id = p_run.run_id;
  return v_run;
end;
$function$;
COMMENT ON FUNCTION runledger._charge(runledger.runs,jsonb,text,integer) IS 'Adds a charge ({"units": n, "tokens": n, "cost_usd": n, "tool_calls": n, "turns": n}, any subset; a bare number is units) to the run: units to budget_spent, the others to budget_used. Past a limit (budget, or a dimension of budget_limits) the run ends TERMINATED (BUDGET) in the same transaction, with evidence naming the dimension, its limit, what was spent, the charge and the step, and the session when the limit is a session budget''s remainder.';

CREATE OR REPLACE FUNCTION runledger._charge_fits(p_budget numeric, p_spent numeric, p_limits jsonb, p_used jsonb, p_charge jsonb)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
  -- True when the charge leaves every dimension within its limit (what _charge would not stop).
  select (p_budget is null or p_spent + coalesce((c->>'units')::numeric, 0) <= p_budget)
         and not exists (
           select 1 from jsonb_each_text(coalesce(p_limits, '{}'::jsonb)) l(dim, lim)
            where coalesce((p_used->>l.dim)::numeric, 0) + coalesce((c->>l.dim)::numeric, 0) > l.lim::numeric)
    from (select runledger._as_charge(p_charge) as c) x
$function$;
COMMENT ON FUNCTION runledger._charge_fits(numeric,numeric,jsonb,jsonb,jsonb) IS 'True when adding the charge to a run with these budgets (budget, budget_spent, budget_limits, budget_used) passes no limit: the group commit then writes it on its fast path; otherwise _charge does, and stops the run.';

CREATE OR REPLACE FUNCTION runledger._charge_now(p_run_id text, p_token bigint, p_charge jsonb, p_step text, p_seq integer)
 RETURNS TABLE(run_status text, budget numeric, budget_spent numeric, budget_limits jsonb, budget_used jsonb)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_run runledger.runs := runledger._fence(p_run_id, p_token);
begin
  -- The point is to survive the worker's crash, which an unflushed commit does; the WAL
  -- record is flushed with the next synchronous commit (the step's checkpoint) at the
  -- latest. Only a database crash in the WAL writer's delay can lose it. Local to this
  -- transaction, so the caller's own commits are not affected.
  perform set_config('synchronous_commit', 'off', true);
  if not runledger._no_charge(p_charge) then
    v_run := runledger._charge(v_run, p_charge, p_step, p_seq);
  end if;
  return query select v_run.status::text, v_run.budget, v_run.budget_spent, v_run.budget_limits, v_run.budget_used;
end;
$function$;
COMMENT ON FUNCTION runledger._charge_now(text,bigint,jsonb,text,integer) IS 'Fenced charge committed on its own, not with a checkpoint (ctx.chargeNow: a model''s usage, reported by the provider, that a crash before the step''s checkpoint must not lose). Its commit does not wait for the WAL flush (synchronous_commit off for this transaction only): a worker crash cannot lose it, the next synchronous commit flushes it. Returns the run''s status (TERMINATED or CANCELLING when the charge passed a limit) and its budgets as they stand. With a null or empty charge it only reads them.';

CREATE OR REPLACE FUNCTION runledger._check_budget_amounts(p_amounts jsonb, p_what text)
 RETURNS void
 LANGUAGE plpgsql
 IMMUTABLE
AS $function$
begin
  if jsonb_typeof(p_amounts) <> 'object' or exists (
       select 1 from jsonb_each(p_amounts) e
        where e.key not in ('units', 'tokens', 'cost_usd', 'tool_calls', 'turns')
           or jsonb_typeof(e.value) <> 'number' or (e.value #>> '{}')::numeric < 0) then
    raise exception using errcode = 'RL003',
      message = format('%s: %s is not an object of amounts >= 0 of units, tokens, cost_usd, tool_calls, turns', p_what, left(p_amounts::text, 200));
  end if;
end;
$function$;
COMMENT ON FUNCTION runledger._check_budget_amounts(jsonb,text) IS 'RL003 unless p_amounts is an object of numbers >= 0 of the budget dimensions (units, tokens, cost_usd, tool_calls, turns).';

CREATE OR REPLACE FUNCTION runledger._check_budget_option(p_budget jsonb, p_caller text)
 RETURNS void
 LANGUAGE plpgsql
 IMMUTABLE
AS $function$
declare
  v_key text;
  v_amount jsonb;
begin
  if p_budget is null or jsonb_typeof(p_budget) = 'null' then
    return;
  end if;
  if jsonb_typeof(p_budget) = 'number' then
    if (p_budget #>> '{}')::numeric < 0 then
      raise exception using errcode = 'RL003', message = format('%s: budget must be a number >= 0, not %s', p_caller, p_budget);
    end if;
    return;
  end if;
  if jsonb_typeof(p_budget) <> 'object' then
    raise exception using errcode = 'RL003',
      message = format('%s: budget must be a number or an object of dimensions (units, tokens, cost_usd, tool_calls, turns), not %s', p_caller, p_budget);
  end if;
  for v_key, v_amount in select key, value from jsonb_each(p_budget) loop
    if v_key <> all (array['units', 'tokens', 'cost_usd', 'tool_calls', 'turns']) then
      raise exception using errcode = 'RL003',
        message = format('%s: budget has an unknown dimension %L (known: units, tokens, cost_usd, tool_calls, turns)', p_caller, v_key);
    end if;
    if jsonb_typeof(v_amount) <> 'number' or (v_amount #>> '{}')::numeric < 0 then
      raise exception using errcode = 'RL003', message = format('%s: budget %s must be a number >= 0, not %s', p_caller, v_key, v_amount);
    end if;
  end loop;
end;
$function$;
COMMENT ON FUNCTION runledger._check_budget_option(jsonb,text) IS 'Raises RL003 unless a budget option is absent, a number >= 0 (units) or an object of dimensions units, tokens, cost_usd, tool_calls, turns, each a number >= 0.';

CREATE OR REPLACE FUNCTION runledger._check_migration_served(p_workflow text, p_from text, p_to text, p_what text)
 RETURNS void
 LANGUAGE plpgsql
 STABLE
AS $function$
begin
  if not exists (select 1 from runledger.live_workers w where (p_workflow || '@' || p_to) = any(w.workflows)) then
    raise exception using errcode = 'RL006',
      message = format('%s: no live worker serves %s@%s; start one, then migrate', p_what, p_workflow, p_to);
  end if;
  if not exists (select 1 from runledger.live_workers w where (p_workflow || '@' || p_from || '>' || p_to) = any(w.migrations)) then
    raise exception using errcode = 'RL006',
      message = format('%s: no live worker has a migration of %s from version %s to %s (migrations: { %L: migrate } on version %s)',
                       p_what, p_workflow, p_from, p_to, p_from, p_to);
  end if;
end;
$function$;
COMMENT ON FUNCTION runledger._check_migration_served(text,text,text,text) IS 'Raises RL006 (UNKNOWN_WORKFLOW) unless a live worker serves workflow@to and has registered the migration workflow@from>to.';

CREATE OR REPLACE FUNCTION runledger._check_not_tenant_bound(p_action text)
 RETURNS void
 LANGUAGE plpgsql
 STABLE
AS $function$
begin
  if (select c.relrowsecurity from pg_class c where c.oid = 'runledger.runs'::regclass) and not runledger._tenant_unbound() then
    raise exception using errcode = '42501',
      message = format('%s: acts on every tenant; with tenant isolation on it needs an operator that is not bound to a tenant (the schema''s owner, or a BYPASSRLS role)', p_action);
  end if;
end;
$function$;
COMMENT ON FUNCTION runledger._check_not_tenant_bound(text) IS 'Refuses (42501) an action on what all tenants share (set_queue, set_retention, clear_retention, prune_due, prune, prune_artifact_blobs) when tenant isolation is on and the caller is bound to a tenant.';

CREATE OR REPLACE FUNCTION runledger._check_progress(p_run runledger.runs, p_step text, p_seq integer, p_hash text)
 RETURNS boolean
 LANGUAGE plpgsql
AS $function$
declare
  v_same int;
  v_seqs int[];
begin
  -- The last no_progress results of this step name, newest first: all identical means the
  -- run keeps seeing the same observation (a loop that learns nothing new).
  select count(*) filter (where s.output_hash = p_hash), array_agg(s.seq order by s.seq)
    into v_same, v_seqs
    from (select output_hash, seq from runledger.steps
           where run_id = p_run.run_id and name = p_step and status = 'SUCCEEDED'
           order by seq desc limit p_run.no_progress) s;
  if v_same < p_run.no_progress then
    return false;
  end if;
  perform runledger._terminate_run(p_run.run_id, p_run.fencing_token, 'NO_PROGRESS',
    jsonb_build_object('step', p_step, 'result_hash', p_hash, 'repeats', v_same, 'seqs', v_seqs, 'limit', p_run.no_progress));
  return true;
end;
$function$;
COMMENT ON FUNCTION runledger._check_progress(runledger.runs,text,integer,text) IS 'No-progress limit: when the last N results of this step name are identical (same hash), ends the run TERMINATED (NO_PROGRESS) with the repeated step as evidence.';

CREATE OR REPLACE FUNCTION runledger._check_run()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
declare
  v_rule text;
begin
  v_rule := case
    when tg_op = 'UPDATE' and old.status is distinct from new.status
         and (old.status::text || '>' || new.status::text) <> all (runledger._transition_pairs()) then 'runs_transition'
    -- An unbounded class plus length(), not {0,199}: a bounded repetition expands into a
    -- large automaton, costly for every inserted row. A run_id never changes: an
    -- UPDATE is checked only if it changes one.
    when (tg_op = 'INSERT' or new.run_id is distinct from old.run_id)
         and (new.run_id !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]*$' or length(new.run_id) > 200) then 'runs_run_id_check'
    when (new.status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER'))
         <> (new.finished_at is not null and new.termination_reason is not null) then 'runs_terminal_has_record'
    when new.termination_reason <> all (runledger.termination_reasons()) then 'runs_termination_reason_check'
    when (new.lease_owner is not null) <> (new.lease_expires_at is not null)
         or (new.status not in ('RUNNING', 'CANCELLING') and new.lease_owner is not null)
         or (new.status = 'RUNNING' and new.lease_owner is null) then 'runs_lease_only_when_executing'
    when new.wait_kind <> all (runledger.wait_kinds()) then 'runs_wait_kind_check'
    when (new.status = 'WAITING') <> (new.wait_kind is not null) then 'runs_wait_kind_only_when_waiting'
    when new.budget < 0 then 'runs_budget_check'
    when new.max_steps <= 0 then 'runs_max_steps_check'
    when new.no_progress < 2 then 'runs_no_progress_check'
    when new.retry_budget < 0 then 'runs_retry_budget_check'
    when new.max_recovery_attempts < 0 then 'runs_max_recovery_attempts_check'
  end;
  if v_rule is null then
    return new;
  elsif v_rule = 'runs_transition' then
    raise exception using errcode = '23514', constraint = v_rule, table = 'runs', schema = 'runledger',
      message = format('run %s: %s -> %s is not a transition of the run state machine (runledger.run_transitions())',
                       old.run_id, old.status, new.status);
  elsif v_rule = 'runs_run_id_check' then
    raise exception using errcode = '23514', constraint = v_rule, table = 'runs', schema = 'runledger',
      message = format('run_id %L is invalid: 1 to 200 letters, digits and _.:- starting with a letter or digit', new.run_id);
  end if;
  raise exception using errcode = '23514', constraint = v_rule, table = 'runs', schema = 'runledger',
    message = format('new row for relation "runs" violates check constraint "%s" (status %s)', v_rule, new.status);
end;
$function$;
COMMENT ON FUNCTION runledger._check_run() IS 'Trigger function of runs_invariants: every rule a runs row obeys; a broken one raises 23514 naming it: runs_transition (a status change that runledger.run_transitions() does not list), runs_run_id_check (1 to 200 characters of [A-Za-z0-9_.:-] starting with a letter or digit), runs_terminal_has_record (a terminal status, and only one, has finished_at and termination_reason), runs_termination_reason_check, runs_lease_only_when_executing (only RUNNING or CANCELLING runs hold a lease; a RUNNING one always does), runs_wait_kind_check, runs_wait_kind_only_when_waiting, and the ranges of budget, max_steps, no_progress, retry_budget and max_recovery_attempts.';

CREATE OR REPLACE FUNCTION runledger._check_step(p_seq integer, p_kind text, p_status text)
 RETURNS boolean
 LANGUAGE plpgsql
 IMMUTABLE
AS $function$
declare
  v_rule text;
begin
  if p_seq < 0 then
    v_rule := 'steps_seq_check';
  elsif p_kind <> all (runledger.step_kinds()) then
    v_rule := 'steps_kind_check';
  elsif p_status not in ('SUCCEEDED', 'FAILED', 'WAITING') then
    v_rule := 'steps_status_check';
  else
    return true;
  end if;
  raise exception using errcode = '23514', constraint = v_rule, table = 'steps', schema = 'runledger',
    message = format('new row for relation "steps" violates check constraint "%s" (kind %s, status %s)', v_rule, p_kind, p_status);
end;
$function$;
COMMENT ON FUNCTION runledger._check_step(integer,text,text) IS 'The invariants of a steps row, checked by its constraint steps_invariants; a broken one raises 23514 naming the rule: steps_seq_check (seq >= 0), steps_kind_check, steps_status_check (SUCCEEDED, FAILED or WAITING).';

CREATE OR REPLACE FUNCTION runledger._check_whole_number(p_opts jsonb, p_key text, p_min integer)
 RETURNS void
 LANGUAGE plpgsql
 IMMUTABLE
AS $function$
begin
  if p_opts ? p_key and jsonb_typeof(p_opts->p_key) <> 'null'
     and (jsonb_typeof(p_opts->p_key) <> 'number' or (p_opts->>p_key) !~ '^\d{1,9}$' or (p_opts->>p_key)::int < p_min) then
    raise exception using errcode = 'RL003',
      message = format('option %s must be a whole number >= %s, not %s', p_key, p_min, p_opts->p_key);
  end if;
end;
$function$;
COMMENT ON FUNCTION runledger._check_whole_number(jsonb,text,integer) IS 'Raises RL003 unless p_opts->p_key is absent or a whole number >= p_min.';

CREATE OR REPLACE FUNCTION runledger._checkpoint(p_run_id text, p_token bigint, p_seq integer, p_name text, p_kind text, p_status text, p_output jsonb, p_error jsonb, p_attempts integer, p_started_ms_ago bigint, p_charge jsonb DEFAULT NULL::jsonb)
 RETURNS TABLE(pid integer, run_status text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
begin
  run_status := (runledger._checkpoint_row(p_run_id, p_token, p_seq, p_name, p_kind, p_status, p_output, p_error,
                                           p_attempts, p_started_ms_ago, p_charge)).status;
  pid := pg_backend_pid();
  return next;
end;
$function$;
COMMENT ON FUNCTION runledger._checkpoint(text,bigint,integer,text,text,text,jsonb,jsonb,integer,bigint,jsonb) IS 'Fenced checkpoint write in the caller''s transaction: checks the fencing token (row lock on the run) and the deadline, inserts the step row, charges p_charge (amounts per dimension, see _charge) to the budgets and checks the no-progress limit (either may end the run TERMINATED right here). Returns the backend pid and the run''s status (CANCELLING tells the worker to stop).';

CREATE OR REPLACE FUNCTION runledger._checkpoint_outcome(p_run_id text, p_seq integer, p_token bigint)
 RETURNS TABLE(committed boolean, status text, output jsonb, error jsonb, still_owner boolean)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_token bigint;
begin
  -- Waits for any transaction still holding the run row (a COMMIT in flight), so the
  -- answer below is final: the checkpoint either exists now or never will.
  select r.fencing_token into v_token from runledger.runs r where r.run_id = p_run_id for update;
  return query
    select s.run_id is not null, s.status, case when s.output is null then null else jsonb_build_array(s.output) end,
           s.error, v_token = p_token
      from (select 1) one
      left join runledger.steps s on s.run_id = p_run_id and s.seq = p_seq and s.fencing_token = p_token;
end;
$function$;
COMMENT ON FUNCTION runledger._checkpoint_outcome(text,integer,bigint) IS 'After a COMMIT whose outcome the client did not see: waits for in-flight transactions on the run, then says whether the checkpoint committed (output wrapped in a one-element array, null when absent).';

CREATE OR REPLACE FUNCTION runledger._checkpoint_row(p_run_id text, p_token bigint, p_seq integer, p_name text, p_kind text, p_status text, p_output jsonb, p_error jsonb, p_attempts integer, p_started_ms_ago bigint, p_charge jsonb DEFAULT NULL::jsonb)
 RETURNS runledger.runs
 LANGUAGE plpgsql
AS $function$
declare
  v_now  timestamptz := runledger.now();
  v_run  runledger.runs := runledger._fence(p_run_id, p_token, v_now);
  v_started timestamptz := runledger._started_at(v_now, p_started_ms_ago);
  v_hash text;
begin
  -- Both times are on the database clock: the start is now minus the elapsed time the worker measured.
  if v_run.status = 'CANCELLING' and v_started >= v_run.cancel_requested_at then
    -- Only a step already running when the cancel was committed may still record its result.
    raise exception using errcode = 'RL008', message = format('run %s: step %s started after the cancel request', p_run_id, p_name);
  end if;
  if v_run.no_progress is not null and p_status = 'SUCCEEDED' then
    v_hash := md5(coalesce(p_output::text, ''));
  end if;
  insert into runledger.steps (run_id, seq, name, kind, status, output, error, attempts, started_at, finished_at, fencing_token, output_hash)
  -- finished_at is the time the deadline was checked against (fence), not a later one.
  values (p_run_id, p_seq, p_name, p_kind, p_status, p_output, p_error, p_attempts, v_started, v_now, p_token, v_hash)
  -- A step that waited between attempts (durable retry backoff) left a WAITING row here.
  on conflict (run_id, seq) do update
     set status = excluded.status, output = excluded.output, error = excluded.error, attempts = excluded.attempts,
         finished_at = excluded.finished_at, fencing_token = excluded.fencing_token, output_hash = excluded.output_hash
   where runledger.steps.status = 'WAITING' and runledger.steps.name = excluded.name;
  if not found then
    raise exception using errcode = 'RL010', message = format('run %s: step %s already has a checkpoint', p_run_id, p_seq);
  end if;
  -- Termination policies are checked atomically with the checkpoint that trips them.
  if not runledger._no_charge(p_charge) then
    v_run := runledger._charge(v_run, p_charge, p_name, p_seq);
  end if;
  if v_hash is not null and v_run.status in ('RUNNING', 'CANCELLING') then
    if runledger._check_progress(v_run, p_name, p_seq, v_hash) then
      -- TERMINATED, or CANCELLING when its compensations run first (_terminate_run).
      select * into v_run from runledger.runs where run_id = p_run_id;
    end if;
  end if;
  return v_run;
end;
$function$;
COMMENT ON FUNCTION runledger._checkpoint_row(text,bigint,integer,text,text,text,jsonb,jsonb,integer,bigint,jsonb) IS 'The body of _checkpoint: fenced checkpoint write (see _checkpoint), returning the run row as it is after the checkpoint (its status says whether a policy ended it).';

CREATE OR REPLACE FUNCTION runledger._claim_batch(p_worker_id text, p_queues text[], p_workflows text[], p_limit integer, p_lease_ms integer, p_reclaim_except text[] DEFAULT NULL::text[], p_deferred jsonb DEFAULT NULL::jsonb)
 RETURNS TABLE(run_id text, workflow_name text, workflow_version text, input jsonb, fencing_token bigint, recovery_attempts integer, max_steps integer, budget numeric, budget_spent numeric, budget_limits jsonb, budget_used jsonb, cancel_requested boolean, checkpoints jsonb, progress jsonb, next_due_in_ms bigint, traceparent text, execution_traceparent text, lineage_id text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET plan_cache_mode TO 'force_generic_plan'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_now   timestamptz := runledger.now();
  v_ids   text[] := '{}';
  v_queue text;
  v_seen  text[] := '{}';
  v_limited boolean;
  v_next  timestamptz;
  v_deferred     jsonb := p_deferred;
  v_deferred_ids text[];
  v_deferred_at  timestamptz[];
begin
  if p_limit is null or p_limit < 1 then
    raise exception using errcode = 'RL003', message = format('_claim_batch: limit must be >= 1, not %s', p_limit);
  end if;
  if p_queues is null or p_workflows is null then
    raise exception using errcode = 'RL003', message = '_claim_batch: queues and workflows must be arrays (empty claims nothing)';
  end if;
  if p_reclaim_except is not null then
    -- A claim whose reply was lost may have committed: take back this worker's runs
    -- that it is not executing (new token), before anything else.
    v_ids := array(
      select r.run_id from runledger.runs r
       where r.lease_owner = p_worker_id and r.status in ('RUNNING', 'CANCELLING')
         and not (r.run_id = any(p_reclaim_except))
       limit p_limit
       for update skip locked);
  end if;

  foreach v_queue in array p_queues loop
    exit when cardinality(v_ids) >= p_limit;
    continue when v_queue = any(v_seen); -- a queue named twice is looked at once
    v_seen := v_seen || v_queue;
    -- A run past its deadline is never put back to work: it ends here instead.
    perform runledger._stop_unowned((d.r).run_id, 'TERMINATED', 'DEADLINE', runledger._deadline_evidence(d.r, v_now))
       from (select r from runledger.runs r
              where r.deadline_at <= v_now and r.status in ('PENDING', 'WAITING') and r.queue_name = v_queue
              limit p_limit
              for update skip locked) d;
    -- A cancelled run whose owner died before its compensations finished.
    v_ids := v_ids || array(
      select r.run_id from runledger.runs r
       where r.queue_name = v_queue and r.status = 'CANCELLING' and r.lease_owner is null
         and (r.workflow_name || '@' || r.workflow_version) = any(p_workflows)
       limit p_limit - cardinality(v_ids)
       for update skip locked);
    v_limited := runledger._queue_limited(v_queue);
    if v_limited then
      -- In a queue with limits a due timer wakes the run into admission instead.
      perform runledger._wake(t.run_id, t.wait_kind, t.wait_key)
         from (select r.run_id, r.wait_kind, r.wait_key from runledger.runs r
                where r.queue_name = v_queue and r.status = 'WAITING' and r.wake_at <= v_now
                  and (r.deadline_at is null or r.deadline_at > v_now)
                order by r.wake_at
                limit p_limit
                for update skip locked) t;
      -- Admitted runs in the order admission chose (priority, fair turns across keys,
      -- age), so a claim with fewer free slots than admitted runs keeps that order. At
      -- most the queue's concurrency is admitted and unclaimed: the sort is small.
      v_ids := v_ids || array(
        select r.run_id from runledger.runs r
         where r.queue_name = v_queue and r.status = 'PENDING' and r.admitted
           and (r.not_before is null or r.not_before <= v_now)
           and (r.deadline_at is null or r.deadline_at > v_now)
           and (r.workflow_name || '@' || r.workflow_version) = any(p_workflows)
         order by r.admitted_at nulls first, r.priority, r.created_at
         limit p_limit - cardinality(v_ids)
         for update skip locked);
      -- Then the runs the admission rounds of a group commit chose and handed to this claim
      -- (p_deferred, from _commit_and_claim), in their rounds' order: each goes from PENDING
      -- to RUNNING in the one update below, with the admitted_at its round gave it;
      -- _admit_deferred admits the ones left. (`admitted is not true`: see _admit_deferred.)
      if v_deferred is not null and cardinality(v_ids) < p_limit then
        v_ids := v_ids || array(
          select r.run_id
            from jsonb_to_recordset(v_deferred) d(q text, id text, at timestamptz)
            join runledger.runs r on r.run_id = d.id
           where d.q = v_queue and r.status = 'PENDING' and r.admitted is not true
             and (r.deadline_at is null or r.deadline_at > v_now)
             and (r.workflow_name || '@' || r.workflow_version) = any(p_workflows)
           order by d.at
           limit p_limit - cardinality(v_ids)
           for update of r skip locked);
        select array_agg(d.id), array_agg(d.at) into v_deferred_ids, v_deferred_at
          from jsonb_to_recordset(v_deferred) d(id text, at timestamptz);
      end if;
      continue;
    else
      -- Runs already under way (a sleep ended, a wait timed out, a retry backoff passed) go first.
      v_ids := v_ids || array(
        select r.run_id from runledger.runs r
         where r.queue_name = v_queue and r.status = 'WAITING' and r.wake_at <= v_now
           and (r.deadline_at is null or r.deadline_at > v_now)
           and (r.workflow_name || '@' || r.workflow_version) = any(p_workflows)
         order by r.wake_at
         limit p_limit - cardinality(v_ids)
         for update skip locked);
    end if;
    v_ids := v_ids || array(
      select r.run_id from runledger.runs r
       where r.queue_name = v_queue and r.status = 'PENDING' and r.admitted
         and (r.not_before is null or r.not_before <= v_now)
         -- Past its deadline: ended above, or by the next claim or the deadline sweep; never claimed.
         and (r.deadline_at is null or r.deadline_at > v_now)
         and (r.workflow_name || '@' || r.workflow_version) = any(p_workflows)
       order by r.priority, r.created_at
       limit p_limit - cardinality(v_ids)
       for update skip locked);
  end loop;

  if cardinality(v_ids) > 0 then
    -- Compare-and-set on the rows locked above: a new fencing token and a lease for each.
    return query
      with claimed as (
        update runledger.runs r
           set status = case when r.status = 'CANCELLING' then 'CANCELLING'::runledger.run_status else 'RUNNING' end,
               fencing_token = r.fencing_token + 1, lease_owner = p_worker_id,
               wait_kind = null, wait_key = null, wake_at = null, admitted = false,
               admitted_at = coalesce(v_deferred_at[array_position(v_deferred_ids, r.run_id)], r.admitted_at),
               lease_expires_at = v_now + make_interval(secs => p_lease_ms / 1000.0),
               started_at = coalesce(r.started_at, v_now), updated_at = v_now
         where r.run_id = any(v_ids)
        returning r.*
      ), logged as (
        insert into runledger.events (run_id, kind, detail, fencing_token, at)
        select c.run_id, 'claimed', jsonb_build_object('worker', p_worker_id), c.fencing_token, v_now from claimed c
      )
      select c.run_id, c.workflow_name, c.workflow_version, c.input, c.fencing_token,
             c.recovery_attempts, c.max_steps, c.budget, c.budget_spent, c.budget_limits, c.budget_used, c.status = 'CANCELLING',
             -- output wrapped in a one-element array so JSON null and "no value" (SQL NULL) stay distinct.
             coalesce((select jsonb_agg(jsonb_build_array(s.seq, s.name, s.status,
                                          case when s.output is null then null else jsonb_build_array(s.output) end,
                                          s.error, s.kind) order by s.seq)
                         from runledger.steps s where s.run_id = c.run_id), '[]'::jsonb),
             (select jsonb_object_agg(p.seq::text, p.progress) from runledger.step_progress p where p.run_id = c.run_id),
             null::bigint, c.traceparent, c.execution_traceparent, c.lineage_id
        from claimed c;
  end if;

  if cardinality(v_ids) < p_limit then
    -- Nothing more is runnable now: say in how long something next will be (a delay on
    -- the database clock, so the worker's clock plays no part in when it claims again).
    foreach v_queue in array v_seen loop
      v_next := least(v_next,
        (select min(r.not_before) from runledger.runs r
          where r.queue_name = v_queue and r.status = 'PENDING' and r.admitted and r.not_before > v_now),
        (select min(r.wake_at) from runledger.runs r
          where r.queue_name = v_queue and r.status = 'WAITING' and r.wake_at > v_now));
    end loop;
    return query select null::text, null::text, null::text, null::jsonb, null::bigint, null::int, null::int,
                        null::numeric, null::numeric, null::jsonb, null::jsonb, null::boolean, null::jsonb, null::jsonb,
                        ceil(extract(epoch from v_next - v_now) * 1000)::bigint, null::text, null::text, null::text;
  end if;
end;
$function$;
COMMENT ON FUNCTION runledger._claim_batch(text,text[],text[],integer,integer,text[],jsonb) IS 'Worker claim of up to p_limit runnable runs of the given queues and workflow@version keys, in one statement: CANCELLING runs without an owner, then due timers, then admitted PENDING runs by priority and age; in a queue with limits, by admitted_at, then the runs p_deferred names (the admission rounds of a group commit with a claim, _commit_and_claim, hand it theirs). Rows are locked FOR UPDATE SKIP LOCKED, so workers never wait on each other. Each becomes RUNNING with fencing_token + 1 and a lease, and is returned with its checkpoints (and its traceparent and the previous execution''s, for tracing, and its lineage_id, null for a run never forked). Runs past their deadline are TERMINATED on the way; a due timer in a queue with limits is woken into admission. When fewer than p_limit were claimed, a last row with run_id null gives next_due_in_ms, the milliseconds until the next delayed start or timer on the database clock (null if none). p_reclaim_except (the runs the worker is executing) also takes back this worker''s other runs: a claim whose reply was lost.';

CREATE OR REPLACE FUNCTION runledger._clear_retention(p_kind text, p_workflow_name text DEFAULT NULL::text)
 RETURNS boolean
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
begin
  delete from runledger.retention r where r.kind = p_kind and coalesce(r.workflow_name, '') = coalesce(p_workflow_name, '');
  return found;
end;
$function$;
COMMENT ON FUNCTION runledger._clear_retention(text,text) IS 'The action behind runledger.clear_retention (which records it in audit_log): removes one rule; returns whether there was one.';

CREATE OR REPLACE FUNCTION runledger._commit_and_claim(p_items jsonb, p_worker_id text, p_queues text[], p_workflows text[], p_limit integer, p_lease_ms integer)
 RETURNS TABLE(item integer, code text, message text, run_status text, run_id text, workflow_name text, workflow_version text, input jsonb, fencing_token bigint, recovery_attempts integer, max_steps integer, budget numeric, budget_spent numeric, budget_limits jsonb, budget_used jsonb, cancel_requested boolean, checkpoints jsonb, progress jsonb, next_due_in_ms bigint, traceparent text, execution_traceparent text, lineage_id text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_row      record;
  v_queues   text[];
  v_deferred jsonb;
begin
  -- The items' rows (the claim's columns null).
  for v_row in select * from runledger._commit_items(p_items) loop
    if v_row.item is null then
      v_queues := v_row.admit_queues;
      continue;
    end if;
    item := v_row.item;
    code := v_row.code;
    message := v_row.message;
    run_status := v_row.run_status;
    return next;
  end loop;
  -- The admission rounds of the slots the commit freed choose their runs but leave them to
  -- the claim below: a run it takes is written once, from PENDING to RUNNING; the rest are
  -- admitted at the end.
  v_deferred := runledger._admit_queues(v_queues, true);
  begin
    -- Rows as _claim_batch returns them (a claimed run each, and the row with only
    -- next_due_in_ms when fewer than p_limit were claimed), with item null.
    return query select null::int, null::text, null::text, null::text,
                        c.run_id, c.workflow_name, c.workflow_version, c.input, c.fencing_token,
                        c.recovery_attempts, c.max_steps, c.budget, c.budget_spent, c.budget_limits, c.budget_used,
                        c.cancel_requested, c.checkpoints, c.progress, c.next_due_in_ms,
                        c.traceparent, c.execution_traceparent, c.lineage_id
                   from runledger._claim_batch(p_worker_id, p_queues, p_workflows, p_limit, p_lease_ms, p_deferred => v_deferred) c;
  exception when others then
    -- The items stand; only the claim is lost (its runs stay claimable).
    return query select null::int, sqlstate::text, sqlerrm, null::text,
                        null::text, null::text, null::text, null::jsonb, null::bigint, null::int, null::int,
                        null::numeric, null::numeric, null::jsonb, null::jsonb, null::boolean, null::jsonb, null::jsonb,
                        null::bigint, null::text, null::text, null::text;
  end;
  -- After the claim or its failure (which undid only what the claim did).
  perform runledger._admit_deferred(v_deferred);
end;
$function$;
COMMENT ON FUNCTION runledger._commit_and_claim(jsonb,text,text[],text[],integer,integer) IS 'Group commit (_commit_items) and then a claim (_claim_batch) in one transaction; the admission rounds of the slots the commit freed (_admit_queues) hand their runs to the claim (p_deferred), which takes what it can from PENDING straight to RUNNING, and _admit_deferred admits the rest. Rows with item set answer the items; rows with item null carry the claim''s rows in _claim_batch''s columns, or, when the claim failed, its SQLSTATE and message in code and message (the items are committed regardless).';

CREATE OR REPLACE FUNCTION runledger._commit_batch(p_items jsonb)
 RETURNS TABLE(item integer, code text, message text, run_status text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_row    record;
  v_queues text[];
begin
  for v_row in select * from runledger._commit_items(p_items) loop
    if v_row.item is null then
      v_queues := v_row.admit_queues;
      continue;
    end if;
    item := v_row.item;
    code := v_row.code;
    message := v_row.message;
    run_status := v_row.run_status;
    return next;
  end loop;
  -- Slots freed by the fast completions are refilled once per queue, at the end.
  perform runledger._admit_queues(v_queues);
end;
$function$;
COMMENT ON FUNCTION runledger._commit_batch(jsonb) IS 'Group commit for a worker: a JSON array of items, each {"op": "checkpoint"} (the arguments of _checkpoint by name: run_id, token, seq, name, kind, status, output, error, attempts, started_ms_ago, charge (absent when none)) or {"op": "complete"} (those of _complete_run, or of _complete_with_checkpoint when it has "seq"; the step''s result is "step_output"; "verification" the evidence of the workflow''s verify), done in one transaction: the common ones together (_commit_fast), the others one by one, each in a subtransaction. One row per item: its index, the SQLSTATE and message of its error (null when it committed), and the run''s status after it (a completion: SUCCEEDED, or the status a charge past the budget ended it with).';

CREATE OR REPLACE FUNCTION runledger._commit_fast(p_items jsonb, OUT written integer[], OUT freed_queues text[])
 RETURNS record
 LANGUAGE plpgsql
 SET plan_cache_mode TO 'force_generic_plan'
AS $function$
declare
  v_now       timestamptz := runledger.now();
  v_ids       text[];
  v_fast      int[];
  v_written   int;
  v_parents   text[];
  v_children  text[];
  v_done      text[];
  v_charged   boolean;
  i           int;
begin
  -- Every run of the batch, locked in run_id order (as the heartbeat locks them), and
  -- the items that can take the fast path. A run named twice takes the careful path.
  -- (The ids as an array: joined to the JSON instead, the planner guessed 100 items and
  -- read the whole runs table.)
  v_ids := array(select distinct e.value->>'run_id' from jsonb_array_elements(p_items) e);
  -- Each item's run id is read from its JSON once, and the items of each run counted by a
  -- window (one sort): read again per pair of items, in the join's filter and in a count per
  -- item, they cost a batch of n items n² JSON lookups.
  with items as (
    select (e.ordinality - 1)::int as idx, e.value as v, e.value->>'run_id' as run_id,
           count(*) over (partition by e.value->>'run_id') as of_run
      from jsonb_array_elements(p_items) with ordinality e
  ), locked as (
    select r.run_id, r.fencing_token, r.status, r.no_progress, r.deadline_at,
           r.budget, r.budget_spent, r.budget_limits, r.budget_used
      from runledger.runs r
     where r.run_id = any(v_ids)
     order by r.run_id
       for update
  )
  select array_agg(it.idx), bool_or(not runledger._no_charge(it.v->'charge')) into v_fast, v_charged
    from items it
    join locked l on l.run_id = it.run_id
   where it.v->>'op' in ('checkpoint', 'complete') and it.v ? 'seq'
     -- A charge within every limit is written here too; one that passes a limit stops the
     -- run, which _charge does on the careful path.
     and (runledger._no_charge(it.v->'charge')
          or runledger._charge_fits(l.budget, l.budget_spent, l.budget_limits, l.budget_used, it.v->'charge'))
     and l.fencing_token = (it.v->>'token')::bigint and l.status = 'RUNNING'
     and l.no_progress is null and (l.deadline_at is null or l.deadline_at > v_now)
     and it.of_run = 1;
  if v_fast is null then
    written := '{}';
    return;
  end if;

  -- The checkpoints (and the last steps of the completions). A position that already
  -- has a checkpoint raises, and the whole fast part is undone.
  insert into runledger.steps (run_id, seq, name, kind, status, output, error, attempts, started_at, finished_at, fencing_token)
  select e.value->>'run_id', (e.value->>'seq')::int, e.value->>'name', e.value->>'kind', e.value->>'status',
         case when e.value->>'op' = 'complete' then e.value->'step_output' else e.value->'output' end,
         e.value->'error', (e.value->>'attempts')::int,
         runledger._started_at(v_now, (e.value->>'started_ms_ago')::bigint), v_now, (e.value->>'token')::bigint
    from jsonb_array_elements(p_items) with ordinality e
   where (e.ordinality - 1)::int = any(v_fast)
  -- A step that waited between attempts (durable retry backoff) left a WAITING row here.
  on conflict (run_id, seq) do update
     set status = excluded.status, output = excluded.output, error = excluded.error, attempts = excluded.attempts,
         finished_at = excluded.finished_at, fencing_token = excluded.fencing_token
   where runledger.steps.status = 'WAITING' and runledger.steps.name = excluded.name;
  get diagnostics v_written = row_count;
  if v_written <> cardinality(v_fast) then
    raise exception using errcode = 'RL010', message = '_commit_fast: a step already has a checkpoint';
  end if;

  -- The charges of the fast items, each within every limit (checked above).
  if v_charged then
    update runledger.runs r
       set budget_spent = r.budget_spent + coalesce((c.charge->>'units')::numeric, 0),
           budget_used = case when c.charge - 'units' = '{}'::jsonb then r.budget_used
                              else runledger._add_amounts(r.budget_used, c.charge - 'units') end
      from (select e.value->>'run_id' as run_id, runledger._as_charge(e.value->'charge') as charge
              from jsonb_array_elements(p_items) with ordinality e
             where (e.ordinality - 1)::int = any(v_fast) and not runledger._no_charge(e.value->'charge')) c
     where r.run_id = c.run_id and r.run_id = any(v_ids);
  end if;

  -- The completions: the run row and its termination record, then the event.
  with done as (
    update runledger.runs r
       set status = 'SUCCEEDED', output = e.value->'output', error = null, finished_at = v_now, updated_at = v_now,
           lease_owner = null, lease_expires_at = null, wait_kind = null, wait_key = null, wake_at = null,
           termination_reason = 'COMPLETED', terminated_at = v_now,
           policy_version = coalesce(r.policy_version, e.value->>'policy_version'),
           termination_evidence = runledger._completed_evidence(
             (select count(*) from runledger.steps s where s.run_id = r.run_id), r, e.value->'verification')
      from jsonb_array_elements(p_items) with ordinality e
     where (e.ordinality - 1)::int = any(v_fast) and e.value->>'op' = 'complete'
       -- By run_id alone: the completions drive the join (a function scan, estimated at one
       -- row whatever the statistics say), each finding its run by the primary key. With
       -- `and r.run_id = any(v_ids)` too, every probe sorted the whole array again (its
       -- index condition is prepared per probe).
       and r.run_id = e.value->>'run_id'
    returning r.run_id, r.fencing_token, r.parent_run_id, r.queue_name, r.termination_evidence
  ), logged as (
    insert into runledger.events (run_id, kind, detail, fencing_token, at)
    select d.run_id, 'completed',
           jsonb_strip_nulls(jsonb_build_object('status', 'SUCCEEDED', 'reason', 'COMPLETED', 'error', null, 'evidence', d.termination_evidence)),
           d.fencing_token, v_now
      from done d
  )
  select array_agg(d.parent_run_id) filter (where d.parent_run_id is not null),
         array_agg(d.run_id) filter (where d.parent_run_id is not null),
         array_agg(distinct d.queue_name),
         array_agg(d.run_id)
    into v_parents, v_children, freed_queues, v_done
    from done d;
  -- As _finished: tell the callers awaiting these runs (one notification for the batch) and
  -- wake the parents; the batch admits the next runs of their queues at its end.
  if v_done is not null then
    perform runledger._announce_finished(v_done);
  end if;
  for i in 1 .. coalesce(cardinality(v_parents), 0) loop
    perform runledger._wake(v_parents[i], 'child', v_children[i]);
  end loop;
  written := v_fast;
end;
$function$;
COMMENT ON FUNCTION runledger._commit_fast(jsonb) IS 'The fast part of every group commit (_commit_items), a batch of one included: locks every run of the batch in run_id order, then writes together the items that are plain checkpoints or completions with their last step of RUNNING runs under their token, before the deadline, with no charge or one within every limit (_charge_fits; it is added to the run''s budgets), without a no-progress limit (the checks _checkpoint and _complete_with_checkpoint make). Returns the indexes it wrote and the queues of the runs it completed (the batch admits them at its end); raises (and is undone as a whole) when one of them cannot be written.';

CREATE OR REPLACE FUNCTION runledger._commit_items(p_items jsonb)
 RETURNS TABLE(item integer, code text, message text, run_status text, admit_queues text[])
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
declare
  v_item jsonb;
  v_index int := 0;
  v_run runledger.runs;
  v_fast int[] := '{}';
  v_fast_queues text[];
  v_covered text[] := '{}';
  v_careful_completions boolean;
begin
  if jsonb_typeof(p_items) is distinct from 'array' then
    raise exception using errcode = 'RL003', message = format('_commit_batch: items must be a JSON array, not %s', coalesce(jsonb_typeof(p_items), 'null'));
  end if;
  -- Every batch, one item included, tries the fast part first: it is the one place a
  -- plain checkpoint or a completion with its last step is written; the items it leaves
  -- (a charge past a limit, a no-progress limit, a stale token, a cancel under way...) take
  -- the general path below.
  if jsonb_array_length(p_items) > 0 then
    begin
      select f.written, f.freed_queues into v_fast, v_fast_queues from runledger._commit_fast(p_items) f;
      v_fast := coalesce(v_fast, '{}');
    exception when others then
      v_fast := '{}'; -- undone: every item takes the careful path below
      v_fast_queues := null;
    end;
  end if;
  -- A completion on the careful path admits its queue's next runs itself (_finished), after
  -- the fast part, so its round also refills what the fast part freed; the caller admits the
  -- other queues of the fast completions at its end. Before several completions take queue
  -- locks one by one, the queues of every completion are locked in name order, as the end
  -- locks them (_admit_queues), so two batches cannot wait on each other in a cycle.
  if cardinality(v_fast) < jsonb_array_length(p_items) and jsonb_array_length(p_items) > 1 then
    select bool_or(e.value->>'op' = 'complete' and (e.ord - 1)::int <> all(v_fast)) into v_careful_completions
      from jsonb_array_elements(p_items) with ordinality e(value, ord);
  end if;
  if v_careful_completions then
    perform 1 from runledger.queues q
     where q.name in (select r.queue_name from runledger.runs r
                       where r.run_id in (select e.value->>'run_id' from jsonb_array_elements(p_items) e where e.value->>'op' = 'complete'))
       and runledger._queue_limited(q.name)
     order by q.name
     for update of q;
  end if;
  for v_item in select value from jsonb_array_elements(p_items) loop
    item := v_index;
    code := null;
    message := null;
    run_status := null;
    admit_queues := null;
    if v_index = any(v_fast) then
      run_status := case when v_item->>'op' = 'checkpoint' then 'RUNNING' else 'SUCCEEDED' end;
    else
      begin
        if v_item->>'op' = 'checkpoint' then
          v_run := runledger._checkpoint_row(v_item->>'run_id', (v_item->>'token')::bigint, (v_item->>'seq')::int,
            v_item->>'name', v_item->>'kind', v_item->>'status', v_item->'output', v_item->'error',
            (v_item->>'attempts')::int, (v_item->>'started_ms_ago')::bigint, v_item->'charge');
          run_status := v_run.status;
        elsif v_item->>'op' = 'complete' and v_item ? 'seq' then
          perform runledger._complete_with_checkpoint(v_item->>'run_id', (v_item->>'token')::bigint, (v_item->>'seq')::int,
            v_item->>'name', v_item->>'kind', v_item->>'status', v_item->'step_output', v_item->'error',
            (v_item->>'attempts')::int, (v_item->>'started_ms_ago')::bigint, v_item->'charge',
            v_item->'output', v_item->>'policy_version', v_item->'verification');
        elsif v_item->>'op' = 'complete' then
          perform runledger._complete_run(v_item->>'run_id', (v_item->>'token')::bigint, v_item->'output',
            v_item->>'policy_version', v_item->'charge', v_item->'verification');
        else
          raise exception using errcode = 'RL003', message = format('_commit_batch: unknown op %L', v_item->>'op');
        end if;
        if v_item->>'op' = 'complete' then
          -- SUCCEEDED, or how the completion ended the run instead (a charge past its budget).
          select r.status into run_status from runledger.runs r where r.run_id = v_item->>'run_id';
        end if;
        if run_status not in ('RUNNING', 'CANCELLING') then
          -- The run left its slot, and the write that ended it admitted its queue (_finished).
          v_covered := v_covered || (select r.queue_name from runledger.runs r where r.run_id = v_item->>'run_id');
        end if;
      exception when others then
        code := sqlstate;
        message := sqlerrm;
      end;
    end if;
    return next;
    v_index := v_index + 1;
  end loop;
  -- The closing row: the queues whose slots the fast part freed and no round covered since.
  item := null;
  code := null;
  message := null;
  run_status := null;
  admit_queues := array(select q from unnest(v_fast_queues) q where q <> all(v_covered));
  return next;
end;
$function$;
COMMENT ON FUNCTION runledger._commit_items(jsonb) IS 'The items of a group commit (_commit_batch, _commit_and_claim), in one transaction: the common ones together (_commit_fast, for a batch of one too), the others one by one, each in a subtransaction (a completion there ends its run through _finished, which admits its queue, after the fast part, so that round covers the fast completions of the queue too). One row per item: its index, the SQLSTATE and message of its error (null when it committed) and the run''s status after it; then a closing row with item null and admit_queues, the queues whose slots the fast part freed and no round has covered, for the caller to admit at its end.';

CREATE OR REPLACE FUNCTION runledger._compensate_run(p_run_id text, p_reason text DEFAULT NULL::text)
 RETURNS text
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
declare
  v_run   runledger.runs;
  v_reset jsonb;
begin
  select * into v_run from runledger.runs where run_id = p_run_id for update;
  if not found then
    raise exception using errcode = 'RL002', message = format('compensate_run: run %L not found', p_run_id);
  end if;
  if v_run.status = 'CANCELLING' then
    return 'CANCELLING'; -- its compensations are already being run
  end if;
  if v_run.status not in ('FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER') then
    raise exception using errcode = 'RL005',
      message = format('compensate_run: run %s is %s; only FAILED, CANCELLED, TERMINATED and DEAD_LETTER runs are compensated this way%s',
                       p_run_id, v_run.status,
                       case when v_run.status = 'SUCCEEDED' then ' (a run that succeeded did its work: its effects are not undone)'
                            else ' (cancel_run stops a run that has not finished and runs its compensations)' end);
  end if;
  -- A compensation recorded FAILED is tried again (with the same key, <key>:compensate);
  -- the failure it held is kept in the event.
  select jsonb_agg(jsonb_build_object('operation_id', o.operation_id, 'name', o.name, 'error', o.compensation_error) order by o.seq)
    into v_reset
    from runledger.operations o
   where o.run_id = p_run_id and o.compensable and o.status = 'SUCCEEDED' and o.compensation_status = 'FAILED';
  update runledger.operations o
     set compensation_status = null, compensation_error = null, updated_at = runledger.now()
   where o.run_id = p_run_id and o.compensable and o.status = 'SUCCEEDED' and o.compensation_status = 'FAILED';
  if not runledger._compensations_due(p_run_id) then
    return v_run.status; -- nothing to undo: every compensation is DONE, or the run has none
  end if;
  insert into runledger.events (run_id, kind, detail, fencing_token)
  values (p_run_id, 'compensation_requested',
          jsonb_strip_nulls(jsonb_build_object('reason', p_reason, 'status', v_run.status, 'retried', v_reset)), v_run.fencing_token);
  perform runledger._stop_for_compensations(v_run, v_run.status, v_run.termination_reason, v_run.termination_evidence,
                                            v_run.error, false);
  return 'CANCELLING';
end;
$function$;
COMMENT ON FUNCTION runledger._compensate_run(text,text) IS 'The action behind runledger.compensate_run (which records it in audit_log): Operator action: runs the compensations of a FAILED, CANCELLED, TERMINATED or DEAD_LETTER run that are not DONE (a FAILED one is tried again). The run becomes CANCELLING without an owner; a worker serving its workflow version claims it, replays its checkpoints (no new step runs), runs them newest first, and the run ends with the status and termination record it had (evidence.compensations says which ran). Returns CANCELLING, or the run''s status when nothing is left to compensate. RL005 for a run that is SUCCEEDED or not finished (use cancel_run).';

CREATE OR REPLACE FUNCTION runledger._compensation_begin(p_run_id text, p_token bigint, p_operation_id text)
 RETURNS text
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_status text;
  v_reused boolean;
begin
  perform runledger._compensation_fence(p_run_id, p_token);
  select compensation_status, prior_operation_id is not null and attempts = 0 into v_status, v_reused
    from runledger.operations where operation_id = p_operation_id and run_id = p_run_id for update;
  if not found then
    -- A checkpoint copied by fork_run: the operation belongs to the source run, not to this one.
    return 'NOT_THIS_RUN';
  end if;
  if v_reused then
    -- A fork reused an ancestor's result: the effect is the ancestor's, not undone by the fork.
    return 'REUSED';
  end if;
  if v_status is null or v_status = 'STARTED' then
    update runledger.operations set compensation_status = 'STARTED', updated_at = runledger.now() where operation_id = p_operation_id;
    insert into runledger.events (run_id, kind, detail, fencing_token)
    values (p_run_id, 'compensation_started', jsonb_build_object('operation_id', p_operation_id, 'again', v_status is not null), p_token);
    return 'STARTED';
  end if;
  return v_status; -- DONE or FAILED: never run again
end;
$function$;
COMMENT ON FUNCTION runledger._compensation_begin(text,bigint,text) IS 'Fenced by _compensation_fence: records that an operation''s compensation starts (a STARTED one left by a crash is run again with the same key); returns DONE or FAILED when it already ran, NOT_THIS_RUN or REUSED for an operation that belongs to an ancestor run (fork_run).';

CREATE OR REPLACE FUNCTION runledger._compensation_fence(p_run_id text, p_token bigint)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
begin
  if (runledger._lock_executing(p_run_id, p_token)).lease_owner is null then
    raise exception using errcode = 'RL001',
      message = format('run %s: lease lost (fencing token %s is stale or the run stopped executing)', p_run_id, p_token);
  end if;
end;
$function$;
COMMENT ON FUNCTION runledger._compensation_fence(text,bigint) IS 'The fence of compensation writes: the run (locked until commit) still carries fencing token p_token, is RUNNING or CANCELLING and is owned (a stopping run handed to the next claim is not); no deadline check. Else RL001.';

CREATE OR REPLACE FUNCTION runledger._compensation_finish(p_run_id text, p_token bigint, p_operation_id text, p_ok boolean, p_error jsonb)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
begin
  perform runledger._compensation_fence(p_run_id, p_token);
  update runledger.operations set compensation_status = case when p_ok then 'DONE' else 'FAILED' end, compensation_error = p_error,
         updated_at = runledger.now()
   where operation_id = p_operation_id and run_id = p_run_id;
  insert into runledger.events (run_id, kind, detail, fencing_token)
  values (p_run_id, case when p_ok then 'compensated' else 'compensation_failed' end,
          jsonb_strip_nulls(jsonb_build_object('operation_id', p_operation_id, 'error', p_error)), p_token);
end;
$function$;
COMMENT ON FUNCTION runledger._compensation_finish(text,bigint,text,boolean,jsonb) IS 'Fenced by _compensation_fence: records a compensation''s outcome, DONE, or FAILED once the worker''s bounded retries are spent (p_error then has the last error and the attempts).';

CREATE OR REPLACE FUNCTION runledger._compensation_summary(p_run_id text)
 RETURNS jsonb
 LANGUAGE sql
 STABLE
AS $function$
  select jsonb_build_object(
           'done', count(*) filter (where o.compensation_status = 'DONE'),
           'failed', coalesce(jsonb_agg(o.name order by o.seq) filter (where o.compensation_status = 'FAILED'), '[]'),
           'not_run', coalesce(jsonb_agg(o.name order by o.seq)
                                 filter (where o.compensation_status is null or o.compensation_status = 'STARTED'), '[]'))
    from runledger.operations o
   where o.run_id = p_run_id and o.compensable and o.status = 'SUCCEEDED'
$function$;
COMMENT ON FUNCTION runledger._compensation_summary(text) IS 'The compensations of a run''s succeeded operations: how many are DONE, and the names of those FAILED and of those not run (a replay that stopped before reaching them, or recovery that gave up).';

CREATE OR REPLACE FUNCTION runledger._compensations_due(p_run_id text)
 RETURNS boolean
 LANGUAGE sql
 STABLE SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
  select exists (select 1 from runledger.operations o
                  where o.run_id = p_run_id and o.compensable and o.status = 'SUCCEEDED'
                    and (o.compensation_status is null or o.compensation_status = 'STARTED'))
$function$;
COMMENT ON FUNCTION runledger._compensations_due(text) IS 'True when the run has a succeeded compensable operation whose compensation has not run (or was cut short by a crash: STARTED).';

CREATE OR REPLACE FUNCTION runledger._complete_run(p_run_id text, p_token bigint, p_output jsonb, p_policy_version text, p_charge jsonb DEFAULT NULL::jsonb, p_verification jsonb DEFAULT NULL::jsonb)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_run runledger.runs := runledger._fence(p_run_id, p_token);
begin
  if not runledger._no_charge(p_charge) then
    v_run := runledger._charge(v_run, p_charge, 'complete', null);
    if v_run.status = 'TERMINATED' or v_run.stop_record is not null then
      return; -- the charge stopped the run (its compensations then run, see _terminate_run)
    end if;
  end if;
  perform runledger._finish_run(p_run_id, p_token, 'SUCCEEDED', 'COMPLETED', p_output, null,
    runledger._completed_evidence((select count(*) from runledger.steps s where s.run_id = p_run_id), v_run, p_verification),
    p_policy_version);
end;
$function$;
COMMENT ON FUNCTION runledger._complete_run(text,bigint,jsonb,text,jsonb,jsonb) IS 'Fenced completion: output, SUCCEEDED and the COMPLETED termination record commit together (a last charge over a budget ends it TERMINATED, BUDGET instead). p_verification: the evidence the workflow''s verify accepted the output with, kept in the record.';

CREATE OR REPLACE FUNCTION runledger._complete_with_checkpoint(p_run_id text, p_token bigint, p_seq integer, p_name text, p_kind text, p_status text, p_step_output jsonb, p_error jsonb, p_attempts integer, p_started_ms_ago bigint, p_charge jsonb, p_output jsonb, p_policy_version text, p_verification jsonb DEFAULT NULL::jsonb)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_run runledger.runs;
begin
  -- The checkpoint's fence locks the run's row; the completion's finds it locked.
  v_run := runledger._checkpoint_row(p_run_id, p_token, p_seq, p_name, p_kind, p_status, p_step_output, p_error,
                                     p_attempts, p_started_ms_ago, p_charge);
  if v_run.status in ('RUNNING', 'CANCELLING') and v_run.stop_record is null then
    perform runledger._finish_run(p_run_id, p_token, 'SUCCEEDED', 'COMPLETED', p_output, null,
      runledger._completed_evidence((select count(*) from runledger.steps s where s.run_id = p_run_id), v_run, p_verification),
      p_policy_version);
  end if;
end;
$function$;
COMMENT ON FUNCTION runledger._complete_with_checkpoint(text,bigint,integer,text,text,text,jsonb,jsonb,integer,bigint,jsonb,jsonb,text,jsonb) IS 'Fenced, the general path of a completion with its last step: writes the step''s checkpoint (_checkpoint_row: charge, no-progress limit) and completes the run (_finish_run) in one transaction, unless the checkpoint itself ended the run (e.g. over budget). The common case is written by _commit_fast.';

CREATE OR REPLACE FUNCTION runledger._completed_evidence(p_steps bigint, p_run runledger.runs, p_verification jsonb)
 RETURNS jsonb
 LANGUAGE sql
 STABLE
AS $function$
  select jsonb_build_object('steps', p_steps, 'budget_spent', p_run.budget_spent)
         || case when p_run.budget_used is null then '{}'::jsonb else jsonb_build_object('budget_used', p_run.budget_used) end
         || case when p_verification is null then '{}'::jsonb else jsonb_build_object('verification', p_verification) end
$function$;
COMMENT ON FUNCTION runledger._completed_evidence(bigint,runledger.runs,jsonb) IS 'The evidence of a COMPLETED termination record: steps, budget_spent (units), budget_used (other dimensions, when any) and verification (what the workflow''s verify accepted the output with, when it has one).';

CREATE OR REPLACE FUNCTION runledger._dead_letter_run(p_run_id text, p_token bigint, p_reason text, p_evidence jsonb, p_policy_version text, p_error jsonb DEFAULT NULL::jsonb)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_error jsonb := coalesce(p_error, jsonb_build_object('name', 'DeadLettered', 'code', p_reason,
                     'message', coalesce(p_evidence->>'message', format('dead-lettered: %s', p_reason))));
begin
  perform runledger._finish_run(p_run_id, p_token, 'DEAD_LETTER', p_reason, null, v_error,
    coalesce(p_evidence, '{}'::jsonb) || jsonb_build_object('last_error', v_error), p_policy_version);
end;
$function$;
COMMENT ON FUNCTION runledger._dead_letter_run(text,bigint,text,jsonb,text,jsonb) IS 'Fenced move to DEAD_LETTER (e.g. NON_DETERMINISM) with evidence and the error that put it there (p_error, or one built from the reason and evidence.message) in runs.error and evidence.last_error; the run leaves the automatic path until retry_run.';

CREATE OR REPLACE FUNCTION runledger._deadline_evidence(p_run runledger.runs, p_now timestamp with time zone)
 RETURNS jsonb
 LANGUAGE sql
 STABLE
AS $function$
  select jsonb_build_object('deadline_at', p_run.deadline_at, 'noticed_at', p_now, 'was', p_run.status,
                            'wait_kind', p_run.wait_kind);
$function$;
COMMENT ON FUNCTION runledger._deadline_evidence(runledger.runs,timestamp with time zone) IS 'The evidence of a DEADLINE stop of a run that holds no worker, the same wherever it is found (the deadline sweep, a claim): deadline_at, noticed_at, was (PENDING or WAITING), wait_kind (null unless WAITING).';

CREATE OR REPLACE FUNCTION runledger._decide_approval(p_request_id text, p_approved boolean, p_decided_by text, p_note text DEFAULT NULL::text)
 RETURNS jsonb
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
declare
  v_approval runledger.approvals;
  v_recorded boolean := false;
  v_by_role  boolean := false;
  v_voter    text;
  v_yes      int;
begin
  if p_approved is null or p_decided_by is null or length(p_decided_by) = 0 then
    raise exception using errcode = 'RL003', message = 'decide_approval: approved and decided_by are required';
  end if;
  select * into v_approval from runledger.approvals where request_id = p_request_id for update;
  if not found then
    raise exception using errcode = 'RL002', message = format('decide_approval: request %L not found', p_request_id);
  end if;
  if v_approval.decision is null and exists (
       select 1 from runledger.runs r where r.run_id = v_approval.run_id and runledger.is_terminal(r.status)) then
    raise exception using errcode = 'RL005', message = format('decide_approval: the run of request %s already finished', p_request_id);
  end if;
  if v_approval.decision is null then
    if v_approval.approvers is not null then
      -- An approver that is a database role is met by the deciding role's membership, never by
      -- the name given; any other approver by the name given.
      v_by_role := exists (select 1 from unnest(v_approval.approvers) a join pg_roles g on g.rolname = a
                            where pg_has_role(runledger._caller(), g.oid, 'MEMBER'));
      if not v_by_role and not exists (select 1 from unnest(v_approval.approvers) a
                                        where a = p_decided_by and not exists (select 1 from pg_roles g where g.rolname = a)) then
        raise exception using errcode = 'RL007',
          message = format('decide_approval: %L may not decide request %s (allowed: %s; decided as login %s, role %s)',
                           p_decided_by, p_request_id, array_to_string(v_approval.approvers, ', '), session_user, runledger._caller());
      end if;
    end if;
    if v_approval.expires_at is not null and v_approval.expires_at <= runledger.now() then
      raise exception using errcode = 'RL005', message = format('decide_approval: request %s expired at %s', p_request_id, v_approval.expires_at);
    end if;
    if v_approval.required > 1 then
      -- One vote per person: the name given, or the login for a role approver (one login is one vote whatever name it gives).
      v_voter := case when v_by_role then session_user::text else p_decided_by end;
      insert into runledger.approval_votes (request_id, voter, approved, note) values (p_request_id, v_voter, p_approved, p_note)
      on conflict (request_id, voter) do nothing;
      if not found then
        return jsonb_build_object('recorded', false, 'request_id', p_request_id, 'approved', null, 'required', v_approval.required,
                                  'votes', runledger._approval_votes(p_request_id));
      end if;
      insert into runledger.events (run_id, kind, detail)
      values (v_approval.run_id, 'approval_vote',
              jsonb_build_object('request_id', p_request_id, 'approved', p_approved, 'voter', v_voter, 'note', p_note,
                                 'db_user', session_user, 'db_role', runledger._caller()));
      select count(*) into v_yes from runledger.approval_votes v where v.request_id = p_request_id and v.approved;
      if p_approved and v_yes < v_approval.required then
        -- Recorded; the request waits for more approvals.
        return jsonb_build_object('recorded', true, 'request_id', p_request_id, 'approved', null, 'required', v_approval.required,
                                  'votes', runledger._approval_votes(p_request_id));
      end if;
    end if;
    update runledger.approvals
       set decision = p_approved, decided_by = p_decided_by, decided_at = runledger.now(), note = p_note,
           decided_db_user = session_user, decided_db_role = runledger._caller()
     where request_id = p_request_id
    returning * into v_approval;
    v_recorded := true;
    insert into runledger.events (run_id, kind, detail)
    values (v_approval.run_id, 'approval_decided',
            jsonb_build_object('request_id', p_request_id, 'approved', p_approved, 'decided_by', p_decided_by, 'note', p_note,
                               'db_user', session_user, 'db_role', runledger._caller()));
    perform runledger._wake(v_approval.run_id, 'approval', p_request_id);
  end if;
  -- The first decision wins; a repeated call answers with the standing decision.
  return jsonb_build_object('recorded', v_recorded, 'request_id', p_request_id, 'approved', v_approval.decision,
                            'decided_by', v_approval.decided_by, 'decided_at', v_approval.decided_at, 'note', v_approval.note)
         || case when v_approval.required > 1
                 then jsonb_build_object('required', v_approval.required, 'votes', runledger._approval_votes(p_request_id))
                 else '{}' end;
end;
$function$;
COMMENT ON FUNCTION runledger._decide_approval(text,boolean,text,text) IS 'The action behind runledger.decide_approval (which records it in audit_log): Decides a pending approval request (approvers that are database roles are checked by the deciding role''s membership; a request with required > 1 records a vote per person and is decided at the required approvals or the first rejection). The first decision wins and stays as audit evidence; later calls return it with recorded = false. An approver outside the request''s list: RL007; expired request: RL005. Wakes the waiting run.';

CREATE OR REPLACE FUNCTION runledger._delete_run_history()
 RETURNS trigger
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
AS $function$
begin
  -- By each table's key (run_id first), whatever the transition table's size: the planner
  -- has no statistics for it, and a plan that reads all of events or steps would cost a
  -- deleted run a table scan.
  delete from runledger.steps s where s.run_id = any (array(select g.run_id from gone g));
  delete from runledger.events e where e.run_id = any (array(select g.run_id from gone g));
  return null;
end;
$function$;
COMMENT ON FUNCTION runledger._delete_run_history() IS 'Trigger function of runs_delete_history: deletes the checkpoints (steps) and events of the runs a statement deleted (steps.run_id and events.run_id have no foreign key; this is their ON DELETE CASCADE).';

CREATE OR REPLACE FUNCTION runledger._delete_session(p_session_id text)
 RETURNS integer
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
declare
  v_tenant  text := runledger._session_scope();
  v_session runledger.sessions;
begin
  perform runledger._session_check_id(p_session_id);
  select * into v_session from runledger.sessions where session_id = p_session_id and tenant_id = v_tenant for update;
  if not found then
    raise exception using errcode = 'RL002', message = format('delete_session: session %L not found', p_session_id);
  end if;
  if v_session.holder_run_id is not null
     or exists (select 1 from runledger.session_waiters w where w.session_id = p_session_id and w.tenant_id = v_tenant) then
    raise exception using errcode = 'RL005',
      message = format('delete_session: session %s is held by run %s or has runs queued; release it first (release_session)', p_session_id,
                       coalesce(v_session.holder_run_id, '-'));
  end if;
  delete from runledger.sessions where session_id = p_session_id and tenant_id = v_tenant;
  return v_session.entry_count;
end;
$function$;
COMMENT ON FUNCTION runledger._delete_session(text) IS 'The action behind runledger.delete_session (which records it in audit_log): Operator action: deletes a session (of the tenant the caller''s session names) that nobody holds or waits for, with its history (entries are kept until then, whatever prune() removes). Returns how many entries went. Held or queued for: RL005; unknown: RL002.';

CREATE OR REPLACE FUNCTION runledger._dispatch(p_run_id text, p_queue text, p_delay_ms bigint DEFAULT 0)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
declare
  v_due timestamptz;
begin
  if p_delay_ms > 0 then
    -- A delayed PENDING run becomes claimable at not_before; a WAITING run already has its wake_at.
    v_due := runledger._ms_after(runledger.now(), p_delay_ms, '_dispatch');
    update runledger.runs set not_before = v_due
     where run_id = p_run_id and status = 'PENDING' and (not_before is null or not_before < v_due);
  end if;
  -- Workers serving the queue claim at once, or arm a timer for the delay ("queue+ms"):
  -- a delay, not a time, so a worker's clock never meets the database's. A worker arms
  -- at most setTimeout's ceiling (24.8 days) and finds a later one by claiming then.
  -- Identical notifications in one transaction are delivered once.
  perform pg_notify('runledger_runnable', p_queue || case when p_delay_ms > 0 then '+' || p_delay_ms else '' end);
end;
$function$;
COMMENT ON FUNCTION runledger._dispatch(text,text,bigint) IS 'Announces that a run of queue p_queue is (or after p_delay_ms will be) runnable: sets not_before for a delayed PENDING run and notifies runledger_runnable with the queue name (and "+" the delay in ms). Workers claim from the runs table; a lost notification only delays a run until the next poll.';

CREATE OR REPLACE FUNCTION runledger._end_wait(p_run_id text, p_seq integer, p_output jsonb)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
begin
  update runledger.steps set status = 'SUCCEEDED', output = p_output, finished_at = runledger.now()
   where run_id = p_run_id and seq = p_seq and status = 'WAITING';
end;
$function$;
COMMENT ON FUNCTION runledger._end_wait(text,integer,jsonb) IS 'Marks the wait step at p_seq finished with its result.';

CREATE OR REPLACE FUNCTION runledger._enforce_deadlines(p_limit integer DEFAULT 1000)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_run   runledger.runs;
  v_count int := 0;
  v_now   timestamptz := runledger.now();
begin
  -- Runs that hold no worker are stopped here; an executing run is stopped by its own
  -- worker at its next checkpoint (RL009), or by recovery if that worker died.
  for v_run in
    select * from runledger.runs r
     where r.status in ('PENDING', 'WAITING') and r.deadline_at <= v_now
     order by r.deadline_at
     limit p_limit
     for update skip locked
  loop
    if runledger._stop_unowned(v_run.run_id, 'TERMINATED', 'DEADLINE', runledger._deadline_evidence(v_run, v_now)) then
      v_count := v_count + 1;
    end if;
  end loop;
  return v_count;
end;
$function$;
COMMENT ON FUNCTION runledger._enforce_deadlines(integer) IS 'Sweeper: PENDING and WAITING runs past their deadline end TERMINATED (DEADLINE), exactly once, with the deadline as evidence. Honours runledger.fake_now. Returns how many.';

CREATE OR REPLACE FUNCTION runledger._environment_reclaimed(p_env_id text, p_worker_id text, p_error jsonb, p_retry_in_ms integer)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_env runledger.environments;
begin
  select * into v_env from runledger.environments e where e.env_id = p_env_id for update;
  if not found or v_env.reclaim_owner is distinct from p_worker_id then
    return false; -- the lease went to another worker meanwhile: its outcome is the one kept
  end if;
  if p_error is null then
    update runledger.environments e
       set reclaimed_at = runledger.now(), reclaimed_status = (select r.status::text from runledger.runs r where r.run_id = e.run_id),
           reclaim_owner = null, reclaim_until = null, last_error = null
     where e.env_id = p_env_id;
    insert into runledger.events (run_id, kind, detail)
    values (v_env.run_id, 'environment_reclaimed', jsonb_build_object('env_id', p_env_id, 'by', p_worker_id, 'attempts', v_env.reclaim_attempts));
  else
    update runledger.environments e
       set reclaim_owner = null, reclaim_until = runledger._ms_after(runledger.now(), p_retry_in_ms, '_environment_reclaimed: p_retry_in_ms'),
           last_error = p_error
     where e.env_id = p_env_id;
    insert into runledger.events (run_id, kind, detail)
    values (v_env.run_id, 'environment_reclaim_failed', jsonb_build_object('env_id', p_env_id, 'by', p_worker_id,
            'attempts', v_env.reclaim_attempts, 'error', p_error, 'retry_in_ms', p_retry_in_ms));
  end if;
  return true;
end;
$function$;
COMMENT ON FUNCTION runledger._environment_reclaimed(text,text,jsonb,integer) IS 'The outcome of a leased reclaim: p_error null records it reclaimed (for the run''s current status) and ends the lease; else the error is kept and the environment is due again after p_retry_in_ms. False when the lease is no longer p_worker_id''s (its outcome is not recorded).';

CREATE OR REPLACE FUNCTION runledger._environment_record(p_run_id text, p_token bigint, p_seq integer, p_attempt integer, p_manifest jsonb)
 RETURNS text
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_run runledger.runs := runledger._fence(p_run_id, p_token);
  v_id  text := runledger._new_id();
begin
  insert into runledger.environments (env_id, run_id, workflow_name, workflow_version, manifest, seq, attempt)
  values (v_id, p_run_id, v_run.workflow_name, v_run.workflow_version, p_manifest, p_seq, p_attempt);
  insert into runledger.events (run_id, kind, detail, fencing_token)
  values (p_run_id, 'environment_created', jsonb_build_object('env_id', v_id, 'seq', p_seq, 'attempt', p_attempt), p_token);
  return v_id;
end;
$function$;
COMMENT ON FUNCTION runledger._environment_record(text,bigint,integer,integer,jsonb) IS 'Fenced: records the environment an attempt of a run''s environment create step made (its manifest), before the step''s checkpoint; returns its env_id.';

CREATE OR REPLACE FUNCTION runledger._environment_renew(p_env_id text, p_worker_id text, p_lease_ms integer)
 RETURNS boolean
 LANGUAGE sql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
  with renewed as (
    update runledger.environments e
       set reclaim_until = runledger._ms_after(runledger.now(), p_lease_ms, '_environment_renew: p_lease_ms')
     where e.env_id = p_env_id and e.reclaim_owner = p_worker_id and e.reclaim_until > runledger.now()
    returning 1)
  select exists (select 1 from renewed)
$function$;
COMMENT ON FUNCTION runledger._environment_renew(text,text,integer) IS 'The worker reclaiming an environment extends its lease by p_lease_ms from now; false when it no longer holds it (the lease ran out and another worker may have taken it).';

CREATE OR REPLACE FUNCTION runledger._environments_due(p_worker_id text, p_workflows text[], p_limit integer, p_lease_ms integer, p_run_id text DEFAULT NULL::text)
 RETURNS TABLE(env_id text, run_id text, workflow_name text, workflow_version text, manifest jsonb, run_status text, attempts integer)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
#variable_conflict use_column
declare
  v_now timestamptz := runledger.now();
begin
  return query
  with due as (
    select e.env_id from runledger.environments e join runledger.runs r on r.run_id = e.run_id
     where (p_run_id is null or e.run_id = p_run_id)
       and (e.workflow_name || '@' || e.workflow_version) = any(p_workflows)
       and runledger.is_terminal(r.status)
       and (e.reclaimed_at is null or e.reclaimed_at < r.finished_at)
       and (e.reclaim_until is null or e.reclaim_until < v_now)
     order by r.finished_at
     limit p_limit
       for update of e skip locked)
  , leased as (
  update runledger.environments e
     set reclaim_owner = p_worker_id, reclaim_until = runledger._ms_after(v_now, p_lease_ms, '_environments_due: p_lease_ms'),
         reclaim_attempts = e.reclaim_attempts + 1
    from due, runledger.runs r
   where e.env_id = due.env_id and r.run_id = e.run_id
  returning e.env_id, e.run_id, e.workflow_name, e.workflow_version, e.manifest, r.status::text as run_status, e.reclaim_attempts)
  select l.env_id, l.run_id, l.workflow_name, l.workflow_version, l.manifest, l.run_status, l.reclaim_attempts from leased l;
end;
$function$;
COMMENT ON FUNCTION runledger._environments_due(text,text[],integer,integer,text) IS 'Leases to p_worker_id up to p_limit environments due for reclaim: their run finished (any terminal status) after their last reclaim, their workflow@version is in p_workflows, and no other worker holds them (reclaim_until passed). Each lease counts a reclaim attempt. p_run_id limits it to one run''s.';

CREATE OR REPLACE FUNCTION runledger._fail_run(p_run_id text, p_token bigint, p_error jsonb, p_policy_version text, p_reason text DEFAULT 'FAILED'::text, p_evidence jsonb DEFAULT NULL::jsonb)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
begin
  if p_reason not in ('FAILED', 'UNVERIFIED') then
    raise exception using errcode = 'RL003', message = format('_fail_run: reason %L is neither FAILED nor UNVERIFIED', p_reason);
  end if;
  perform runledger._finish_run(p_run_id, p_token, 'FAILED', p_reason, null, p_error, p_evidence, p_policy_version);
end;
$function$;
COMMENT ON FUNCTION runledger._fail_run(text,bigint,jsonb,text,text,jsonb) IS 'Fenced failure: FAILED with the error and the termination record: reason FAILED (the workflow threw) or UNVERIFIED (the workflow''s verify refused its output; p_evidence holds the reason it gave).';

CREATE OR REPLACE FUNCTION runledger._fence(p_run_id text, p_token bigint, p_now timestamp with time zone DEFAULT NULL::timestamp with time zone)
 RETURNS runledger.runs
 LANGUAGE plpgsql
AS $function$
declare
  v_run runledger.runs := runledger._lock_executing(p_run_id, p_token);
  v_now timestamptz := coalesce(p_now, runledger.now());
begin
  if v_run.deadline_at <= v_now then
    -- Nothing commits past the deadline; the worker then ends the run (TERMINATED, DEADLINE).
    raise exception using errcode = 'RL009', message = format('run %s: deadline %s passed', p_run_id, v_run.deadline_at);
  end if;
  return v_run;
end;
$function$;
COMMENT ON FUNCTION runledger._fence(text,bigint,timestamp with time zone) IS 'Returns the run, locked until commit, if the caller still holds it with this fencing token; else raises RL001 LEASE_LOST. Past the run''s deadline raises RL009, so nothing commits after it.';

CREATE OR REPLACE FUNCTION runledger._finish_cancel(p_run_id text, p_token bigint)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_run runledger.runs;
begin
  v_run := runledger._lock_executing(p_run_id, p_token);
  if v_run.status <> 'CANCELLING' then
    raise exception using errcode = 'RL001', message = format('run %s: not CANCELLING under fencing token %s', p_run_id, p_token);
  end if;
  perform runledger._finish_run(p_run_id, p_token, 'CANCELLED', 'CANCELLED', null, null,
    jsonb_build_object('reason', v_run.cancel_reason, 'requested_at', v_run.cancel_requested_at,
                       'steps', (select count(*) from runledger.steps s where s.run_id = p_run_id and s.status <> 'WAITING')),
    null);
end;
$function$;
COMMENT ON FUNCTION runledger._finish_cancel(text,bigint) IS 'Fenced: the owner of a CANCELLING run ends it CANCELLED with the cancel request as evidence.';

CREATE OR REPLACE FUNCTION runledger._finish_run(p_run_id text, p_token bigint, p_status runledger.run_status, p_reason text, p_output jsonb, p_error jsonb, p_evidence jsonb, p_policy_version text)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
declare
  v_now      timestamptz := runledger.now();
  v_parent   text;
  v_queue    text;
  v_status   runledger.run_status;
  v_reason   text;
  v_error    jsonb;
  v_evidence jsonb;
begin
  perform runledger._lock_executing(p_run_id, p_token);
  -- One statement (the SET expressions read the row as it was). A run that was stopping
  -- (a policy stop, or compensate_run) ends with the record of what stopped it, whatever
  -- its last execution ended with; the evidence then says which compensations ran.
  update runledger.runs
     set status = coalesce((stop_record->>'status')::runledger.run_status, p_status),
         output = case when stop_record is null then p_output end,
         error = case when stop_record is null then p_error else stop_record->'error' end,
         finished_at = v_now, updated_at = v_now,
         lease_owner = null, lease_expires_at = null, wait_kind = null, wait_key = null, wake_at = null,
         termination_reason = coalesce(stop_record->>'reason', p_reason),
         termination_evidence = case when stop_record is null then p_evidence
                                     else coalesce(stop_record->'evidence', '{}'::jsonb)
                                          || jsonb_build_object('compensations', runledger._compensation_summary(run_id)) end,
         terminated_at = v_now,
         policy_version = coalesce(policy_version, p_policy_version), stop_record = null
   where run_id = p_run_id
  returning parent_run_id, queue_name, status, termination_reason, error, termination_evidence
       into v_parent, v_queue, v_status, v_reason, v_error, v_evidence;
  perform runledger._finished(p_run_id, p_token, v_status, v_reason, v_error, v_evidence, v_parent, v_queue, v_now);
end;
$function$;
COMMENT ON FUNCTION runledger._finish_run(text,bigint,runledger.run_status,text,jsonb,jsonb,jsonb,text) IS 'Fenced move of an executing run to a terminal status with its termination record (reason, evidence, time, policy version). A CANCELLING run with a stop_record ends with that record instead, its evidence extended with the outcome of its compensations.';

CREATE OR REPLACE FUNCTION runledger._finished(p_run_id text, p_token bigint, p_status runledger.run_status, p_reason text, p_error jsonb, p_evidence jsonb, p_parent text, p_queue text, p_now timestamp with time zone)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
begin
  insert into runledger.events (run_id, kind, detail, fencing_token, at)
  values (p_run_id, case p_status when 'DEAD_LETTER' then 'dead_lettered' else lower(p_reason) end,
          jsonb_strip_nulls(jsonb_build_object('status', p_status, 'reason', p_reason, 'error', p_error, 'evidence', p_evidence)), p_token, p_now);
  perform pg_notify('runledger_finished', p_run_id);
  -- As _wake_parent and _slot_freed, without reading the row again.
  if p_parent is not null then
    perform runledger._wake(p_parent, 'child', p_run_id);
  end if;
  if runledger._queue_limited(p_queue) then
    perform runledger._admit(p_queue);
  end if;
end;
$function$;
COMMENT ON FUNCTION runledger._finished(text,bigint,runledger.run_status,text,jsonb,jsonb,text,text,timestamp with time zone) IS 'After a run''s row moved to a terminal status: writes its event, notifies runledger_finished with its id, wakes its parent (p_parent) and admits the next run of its queue if the queue has limits.';

CREATE OR REPLACE FUNCTION runledger._fork_key_notice(p_fork text, p_source text, p_source_never_forked boolean, p_keys text)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
AS $function$
  select format('fork_run: the fork %s runs again operations of run %s whose idempotency keys hold that run''s id: %s. '
                'A key made from ctx.runId is new in the fork, which then calls the operation again under it: a second '
                'effect (a second payment, a second ticket). A key made from ctx.lineageId (the same in every fork) or from '
                'the business entity stays the same, and the fork reuses the effect the source recorded%s',
                p_fork, p_source, p_keys,
                case when p_source_never_forked
                     then format(' (run %s was never forked: its lineage id is its run id, so a key made from ctx.lineageId is listed too)', p_source)
                     else '' end)
$function$;
COMMENT ON FUNCTION runledger._fork_key_notice(text,text,boolean,text) IS 'The NOTICE fork_run gives when operations the fork runs again (from from_step on) have idempotency keys that hold the source''s run id (p_keys: name, step and key of each): made from ctx.runId, each is called again under a new key in the fork.';

CREATE OR REPLACE FUNCTION runledger._fork_run(p_run_id text, p_from_step integer, p_version text DEFAULT NULL::text)
 RETURNS text
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
declare
  v_src  runledger.runs;
  v_id   text := runledger._new_id();
  v_done int;
  v_now  timestamptz := runledger.now();
  v_manifest jsonb;
  v_undone jsonb;
  v_keys   text;
begin
  -- FOR KEY SHARE: retention (prune_due) skips the source while the fork is being made.
  select * into v_src from runledger.runs where run_id = p_run_id for key share;
  if not found then
    raise exception using errcode = 'RL002', message = format('fork_run: run %L not found', p_run_id);
  end if;
  select count(*) into v_done from runledger.steps where run_id = p_run_id and status <> 'WAITING';
  if p_from_step is null or p_from_step < 0 or p_from_step > v_done then
    raise exception using errcode = 'RL003',
      message = format('fork_run: from_step must be between 0 and %s (the checkpoints of run %s), not %s', v_done, p_run_id, p_from_step);
  end if;
  -- A copied checkpoint of an operation whose effect a compensation undid would let the fork
  -- go on as if it stood (ship against a refunded charge): fork from before it, which calls
  -- the operation again (_operation_begin: a new attempt under its key).
  v_undone := runledger._undone_operations(p_run_id, p_from_step);
  if v_undone <> '[]'::jsonb then
    raise exception using errcode = 'RL005', message = runledger._undone_refusal('fork_run', p_run_id, v_undone);
  end if;
  v_manifest := v_src.version_manifest;
  if p_version is not null and p_version <> v_src.workflow_version then
    -- The fork runs on another version's code (after a fix, or past a non-determinism):
    -- it takes that version's manifest, as a run started on it would.
    select w.manifest into v_manifest from runledger.workflows w
     where w.workflow_name = v_src.workflow_name and w.workflow_version = p_version;
    if not found then
      raise exception using errcode = 'RL006',
        message = format('fork_run: workflow %s has no version %L registered (a worker or engine that defines it registers it)', v_src.workflow_name, p_version);
    end if;
    v_manifest := coalesce(v_manifest, '{}');
  end if;
  insert into runledger.runs (
    run_id, workflow_name, workflow_version, queue_name, input, priority, concurrency_key, tenant_id,
    deadline_at, max_recovery_attempts, version_manifest, max_steps, budget, no_progress, retry_budget,
    policy_version, created_at, updated_at, lineage_id)
  values (
    v_id, v_src.workflow_name, coalesce(p_version, v_src.workflow_version), v_src.queue_name, v_src.input, v_src.priority, v_src.concurrency_key,
    v_src.tenant_id,
    -- The fork gets the same lifetime the source had, counted from now.
    v_now + (v_src.deadline_at - v_src.created_at), v_src.max_recovery_attempts,
    v_manifest || jsonb_build_object('forked_from', p_run_id, 'from_step', p_from_step),
    v_src.max_steps, v_src.budget, v_src.no_progress, v_src.retry_budget, v_src.policy_version, v_now, v_now,
    -- ctx.lineageId: the run the chain of forks started from.
    coalesce(v_src.lineage_id, v_src.run_id));
  -- Finished checkpoints before from_step are reused: those steps do not run again in the fork.
  insert into runledger.steps (run_id, seq, name, kind, status, output, error, attempts, started_at, finished_at, fencing_token, output_hash)
  select v_id, s.seq, s.name, s.kind, s.status, s.output, s.error, s.attempts, s.started_at, s.finished_at, 0, s.output_hash
    from runledger.steps s
   where s.run_id = p_run_id and s.seq < p_from_step and s.status <> 'WAITING';
  insert into runledger.events (run_id, kind, detail, at) values
    (v_id, 'created', jsonb_build_object('forked_from', p_run_id, 'from_step', p_from_step,
                                          'from_version', v_src.workflow_version, 'version', coalesce(p_version, v_src.workflow_version)), v_now),
    (p_run_id, 'forked', jsonb_build_object('fork', v_id, 'from_step', p_from_step, 'version', coalesce(p_version, v_src.workflow_version)), v_now);
  -- The operations the fork runs again whose key holds the source's run id: made from ctx.runId,
  -- such a key is new in the fork, which then calls again (a second payment). Said, not refused:
  -- a key made from ctx.lineageId holds it too when the source was never forked.
  select string_agg(format('%s (step %s, key %s)', o.name, o.seq, o.idempotency_key), ', ' order by o.seq) into v_keys
    from runledger.operations o
   where o.run_id = p_run_id and o.seq >= p_from_step and strpos(o.idempotency_key, p_run_id) > 0;
  if v_keys is not null then
    raise notice using message = runledger._fork_key_notice(v_id, p_run_id, v_src.lineage_id is null, v_keys);
  end if;
  perform runledger._make_runnable(v_id, 0);
  return v_id;
end;
$function$;
COMMENT ON FUNCTION runledger._fork_run(text,integer,text) IS 'The action behind runledger.fork_run (which records it in audit_log): Operator action: starts a new run of the same workflow and input that reuses the source run''s checkpoints before step from_step (0 = start over) and runs the rest, on the source''s version or on version (a registered version of the workflow, with its manifest). Returns the new run_id. Operations copied this way are not compensated by the fork. The fork''s lineage_id is the source''s (or the source''s run id). RL005 when a checkpoint it would copy is of an operation a compensation undid (runledger._undone_operations: fork from before it). A NOTICE lists the operations from from_step on whose idempotency key holds the source''s run id (made from ctx.runId, the fork calls them again under a new key).';

CREATE OR REPLACE FUNCTION runledger._give_back_grants(p_functions text[])
 RETURNS void
 LANGUAGE plpgsql
AS $function$
declare
  v_grant record;
begin
  for v_grant in
    select f.role_name, p.oid::regprocedure as fn
      from runledger.role_functions f
      join pg_proc p on p.pronamespace = 'runledger'::regnamespace and p.proname = f.function_name
     where f.function_name = any(p_functions)
       and exists (select from pg_roles r where r.rolname = f.role_name)
  loop
    execute format('grant execute on function %s to %I', v_grant.fn, v_grant.role_name);
  end loop;
end;
$function$;
COMMENT ON FUNCTION runledger._give_back_grants(text[]) IS 'For a migration that dropped and created functions again (a new signature): each existing role that role_functions gives one of p_functions gets execute on it again.';

CREATE OR REPLACE FUNCTION runledger._graph_delete_thread(p_thread_id text)
 RETURNS void
 LANGUAGE sql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
  delete from runledger.graph_writes where thread_id = p_thread_id;
  delete from runledger.graph_blobs where thread_id = p_thread_id;
  delete from runledger.graph_checkpoints where thread_id = p_thread_id;
$function$;
COMMENT ON FUNCTION runledger._graph_delete_thread(text) IS 'RunledgerSaver.deleteThread: every checkpoint, channel value and pending write of a thread, in every namespace.';

CREATE OR REPLACE FUNCTION runledger._graph_put(p_thread_id text, p_ns text, p_checkpoint_id text, p_parent_id text, p_checkpoint jsonb, p_metadata jsonb, p_channels text[], p_versions text[], p_types text[], p_blobs bytea[], p_run_id text DEFAULT NULL::text, p_token bigint DEFAULT NULL::bigint)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
begin
  if p_thread_id is null or p_checkpoint_id is null or p_checkpoint is null then
    raise exception using errcode = 'RL003', message = '_graph_put: thread_id, checkpoint_id and checkpoint are required';
  end if;
  if p_token is not null then
    -- Written by a run's execution (runGraph): only while it still holds the run (RL001 otherwise).
    perform runledger._fence(p_run_id, p_token);
  end if;
  insert into runledger.graph_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
  select p_thread_id, coalesce(p_ns, ''), c, v, t, b
    from unnest(p_channels, p_versions, p_types, p_blobs) as u(c, v, t, b)
  on conflict do nothing;
  insert into runledger.graph_checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata, run_id)
  values (p_thread_id, coalesce(p_ns, ''), p_checkpoint_id, p_parent_id, p_checkpoint, coalesce(p_metadata, '{}'), p_run_id)
  on conflict (thread_id, checkpoint_ns, checkpoint_id)
  do update set checkpoint = excluded.checkpoint, metadata = excluded.metadata;
end;
$function$;
COMMENT ON FUNCTION runledger._graph_put(text,text,text,text,jsonb,jsonb,text[],text[],text[],bytea[],text,bigint) IS 'RunledgerSaver.put: the channel values of the checkpoint''s new versions (once per version) and the checkpoint, in one transaction; putting the same checkpoint id again replaces its checkpoint and metadata. With p_token (runGraph), fenced: refused with RL001 unless the execution still holds run p_run_id under that token.';

CREATE OR REPLACE FUNCTION runledger._graph_put_writes(p_thread_id text, p_ns text, p_checkpoint_id text, p_task_id text, p_task_path text, p_idx integer[], p_channels text[], p_types text[], p_blobs bytea[], p_replace boolean, p_run_id text DEFAULT NULL::text, p_token bigint DEFAULT NULL::bigint)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
begin
  if p_token is not null then
    perform runledger._fence(p_run_id, p_token);
  end if;
  if p_replace then
    insert into runledger.graph_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob, task_path)
    select p_thread_id, coalesce(p_ns, ''), p_checkpoint_id, p_task_id, i, c, t, b, coalesce(p_task_path, '')
      from unnest(p_idx, p_channels, p_types, p_blobs) as u(i, c, t, b)
    on conflict (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
    do update set channel = excluded.channel, type = excluded.type, blob = excluded.blob;
  else
    insert into runledger.graph_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob, task_path)
    select p_thread_id, coalesce(p_ns, ''), p_checkpoint_id, p_task_id, i, c, t, b, coalesce(p_task_path, '')
      from unnest(p_idx, p_channels, p_types, p_blobs) as u(i, c, t, b)
    on conflict do nothing;
  end if;
end;
$function$;
COMMENT ON FUNCTION runledger._graph_put_writes(text,text,text,text,text,integer[],text[],text[],bytea[],boolean,text,bigint) IS 'RunledgerSaver.putWrites: a task''s writes after a checkpoint, in one transaction. A regular write is kept as first written (a task run again writes the same); the special channels (errors, interrupts, resumes: p_replace) replace what was there, as LangGraph asks. With p_token (runGraph), fenced as _graph_put.';

CREATE OR REPLACE FUNCTION runledger._heartbeat(p_worker_id text, p_lease_ms integer, p_except text[] DEFAULT '{}'::text[])
 RETURNS text[]
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_now  timestamptz := runledger.now();
  v_runs text[];
begin
  update runledger.workers set last_heartbeat_at = v_now, stopped_at = null where worker_id = p_worker_id;
  -- One statement renews every lease this worker holds. A run taken over by another
  -- worker has another lease_owner and is not renewed: the caller sees it missing.
  with held as (
    select r.run_id from runledger.runs r
     where r.lease_owner = p_worker_id and r.status in ('RUNNING', 'CANCELLING')
       -- Runs inside a step that heartbeats itself are kept alive by that step only.
       and r.run_id <> all (p_except)
     order by r.run_id
     for update
  ), renewed as (
    update runledger.runs r
       set lease_expires_at = v_now + make_interval(secs => p_lease_ms / 1000.0)
      from held
     where r.run_id = held.run_id and r.lease_owner = p_worker_id and r.status in ('RUNNING', 'CANCELLING')
    returning r.run_id)
  select coalesce(array_agg(run_id), '{}') into v_runs from renewed;
  return v_runs;
end;
$function$;
COMMENT ON FUNCTION runledger._heartbeat(text,integer,text[]) IS 'Worker heartbeat: marks the worker alive and renews the leases of all runs it owns, except p_except (runs whose current step heartbeats itself); returns the ids renewed.';

CREATE OR REPLACE FUNCTION runledger._heartbeat_step(p_run_id text, p_token bigint, p_seq integer, p_progress jsonb, p_lease_ms integer)
 RETURNS text
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_run runledger.runs;
begin
  perform runledger._lock_executing(p_run_id, p_token);
  update runledger.runs set lease_expires_at = runledger.now() + make_interval(secs => p_lease_ms / 1000.0)
   where run_id = p_run_id
  returning * into v_run;
  if p_progress is not null then
    insert into runledger.step_progress (run_id, seq, progress) values (p_run_id, p_seq, p_progress)
    on conflict (run_id, seq) do update set progress = excluded.progress, updated_at = runledger.now();
  end if;
  return v_run.status;
end;
$function$;
COMMENT ON FUNCTION runledger._heartbeat_step(text,bigint,integer,jsonb,integer) IS 'Fenced: a long step proves it is alive: renews its run''s lease and stores its progress. Returns the run status (CANCELLING tells the step to stop).';

CREATE OR REPLACE FUNCTION runledger._instant(p_value text, p_what text)
 RETURNS timestamp with time zone
 LANGUAGE plpgsql
 STABLE
AS $function$
declare
  v_at timestamptz;
begin
  if p_value is null then
    return null;
  end if;
  begin
    v_at := p_value::timestamptz;
  exception when data_exception then
    raise exception using errcode = 'RL003', message = format('%s: %L is not a timestamp', p_what, p_value);
  end;
  if not isfinite(v_at) then
    raise exception using errcode = 'RL003',
      message = format('%s: %L is not a finite timestamp (infinity and -infinity are refused)', p_what, p_value);
  end if;
  return v_at;
end;
$function$;
COMMENT ON FUNCTION runledger._instant(text,text) IS 'p_value read as a timestamptz (null for null). RL003, naming p_what, for text that is not a timestamp and for infinity and -infinity.';

CREATE OR REPLACE FUNCTION runledger._is_traceparent(p text)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
  select p ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
     and substr(p, 4, 32) <> repeat('0', 32) and substr(p, 37, 16) <> repeat('0', 16)
$function$;
COMMENT ON FUNCTION runledger._is_traceparent(text) IS 'True when p is a W3C traceparent of version 00 (00-<32 hex trace id>-<16 hex span id>-<2 hex flags>, lower case, neither id all zeros): the form runs.traceparent and runs.execution_traceparent hold.';

CREATE OR REPLACE FUNCTION runledger._isolated_tables()
 RETURNS text[]
 LANGUAGE sql
 IMMUTABLE
AS $function$
  select array['runs', 'steps', 'events', 'signals', 'approvals', 'approval_votes', 'operations', 'step_progress', 'stream_chunks',
               'stream_ends', 'artifacts', 'artifact_blobs', 'session_entries', 'session_waiters', 'sessions', 'audit_log']
$function$;
COMMENT ON FUNCTION runledger._isolated_tables() IS 'The tables that hold a run''s data and carry the tenant_isolation policy.';

CREATE OR REPLACE FUNCTION runledger._lock_executing(p_run_id text, p_token bigint)
 RETURNS runledger.runs
 LANGUAGE plpgsql
AS $function$
declare
  v_run runledger.runs;
begin
  select * into v_run from runledger.runs where run_id = p_run_id for update;
  if not found or v_run.fencing_token is distinct from p_token or v_run.status not in ('RUNNING', 'CANCELLING') then
    raise exception using errcode = 'RL001',
      message = format('run %s: lease lost (fencing token %s is stale or the run stopped executing)', p_run_id, p_token);
  end if;
  return v_run;
end;
$function$;
COMMENT ON FUNCTION runledger._lock_executing(text,bigint) IS 'Returns the run, locked until commit, if it is RUNNING or CANCELLING under fencing token p_token; else raises RL001 LEASE_LOST. The lock every fenced write of an executing run starts from (_fence adds the deadline).';

CREATE OR REPLACE FUNCTION runledger._made_progress(p_run_id text, p_token bigint)
 RETURNS boolean
 LANGUAGE sql
 STABLE
AS $function$
  select exists (select 1 from runledger.steps s
                  where s.run_id = p_run_id and s.fencing_token = p_token and s.status in ('SUCCEEDED', 'FAILED'))
$function$;
COMMENT ON FUNCTION runledger._made_progress(text,bigint) IS 'True when the execution holding fencing token p_token committed a checkpoint (SUCCEEDED or FAILED step): the progress that resets recovery_attempts when that execution is recovered or released.';

CREATE OR REPLACE FUNCTION runledger._maintenance_begin(p_task text, p_worker_id text, p_every_ms bigint, p_lease_ms bigint)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_now timestamptz := runledger.now();
begin
  insert into runledger.maintenance (task) values (p_task) on conflict do nothing;
  -- Due (not started within p_every_ms, by any worker) and not leased to another worker.
  update runledger.maintenance m
     set worker_id = p_worker_id, started_at = v_now, lease_until = v_now + make_interval(secs => p_lease_ms / 1000.0)
   where m.task = p_task
     and (m.started_at is null or m.started_at <= v_now - make_interval(secs => p_every_ms / 1000.0))
     and (m.lease_until is null or m.lease_until < v_now);
  return found;
end;
$function$;
COMMENT ON FUNCTION runledger._maintenance_begin(text,text,bigint,bigint) IS 'A worker asks for a cluster-wide task (retention): true, and the task is leased to it for p_lease_ms, when no worker started it within p_every_ms and no other worker holds its lease. Once per interval across the cluster, on one worker at a time.';

CREATE OR REPLACE FUNCTION runledger._maintenance_end(p_task text, p_worker_id text, p_result jsonb, p_lease_ms bigint DEFAULT NULL::bigint)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_now timestamptz := runledger.now();
begin
  -- p_lease_ms: still running, the lease is renewed; null: done, the lease is let go.
  update runledger.maintenance m
     set lease_until = case when p_lease_ms is null then null else v_now + make_interval(secs => p_lease_ms / 1000.0) end,
         finished_at = case when p_lease_ms is null then v_now else m.finished_at end,
         last_result = coalesce(p_result, m.last_result)
   where m.task = p_task and m.worker_id = p_worker_id and m.lease_until >= v_now;
  return found;
end;
$function$;
COMMENT ON FUNCTION runledger._maintenance_end(text,text,jsonb,bigint) IS 'The worker holding a task''s lease renews it (p_lease_ms) or lets it go (null), recording what it did; false when the lease is no longer its own (expired and taken, or never held), and it should stop.';

CREATE OR REPLACE FUNCTION runledger._make_runnable(p_run_id text, p_delay_ms bigint DEFAULT 0)
 RETURNS void
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
declare
  v_run runledger.runs;
begin
  select * into v_run from runledger.runs where run_id = p_run_id;
  if runledger._queue_limited(v_run.queue_name) then
    update runledger.runs
       set admitted = false,
           not_before = case when p_delay_ms > 0 then runledger._ms_after(runledger.now(), p_delay_ms, '_make_runnable') else not_before end
     where run_id = p_run_id;
    perform runledger._admit(v_run.queue_name);
  else
    if not v_run.admitted then
      update runledger.runs set admitted = true where run_id = p_run_id;
    end if;
    perform runledger._dispatch(p_run_id, v_run.queue_name, p_delay_ms);
  end if;
end;
$function$;
COMMENT ON FUNCTION runledger._make_runnable(text,bigint) IS 'Every move of a run into PENDING ends here: dispatched at once (after p_delay_ms) in a queue without limits, else left to admission.';

CREATE OR REPLACE FUNCTION runledger._max_payload_bytes()
 RETURNS integer
 LANGUAGE sql
 STABLE PARALLEL SAFE
AS $function$
  select coalesce(nullif(current_setting('runledger.max_payload_bytes', true), '')::int, 4194304)
$function$;
COMMENT ON FUNCTION runledger._max_payload_bytes() IS 'Largest input/output accepted, in bytes: setting runledger.max_payload_bytes, default 4 MiB.';

CREATE OR REPLACE FUNCTION runledger._migratable(p_status runledger.run_status)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
  select p_status in ('PENDING', 'WAITING', 'DEAD_LETTER')
$function$;
COMMENT ON FUNCTION runledger._migratable(runledger.run_status) IS 'True for the statuses migrate_run takes: PENDING, WAITING and DEAD_LETTER (no worker executes the run, and it is not finished).';

CREATE OR REPLACE FUNCTION runledger._migrate_run(p_run_id text, p_to_version text)
 RETURNS boolean
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
declare
  v_run    runledger.runs;
  v_undone jsonb;
begin
  if p_to_version is null or p_to_version !~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,19}$' then
    raise exception using errcode = 'RL003', message = format('migrate_run: to_version %L is not a version name', p_to_version);
  end if;
  select * into v_run from runledger.runs where run_id = p_run_id for update;
  if not found then
    raise exception using errcode = 'RL002', message = format('migrate_run: run %L not found', p_run_id);
  end if;
  if v_run.workflow_version = p_to_version then
    raise exception using errcode = 'RL005',
      message = format('migrate_run: run %s is already on version %s of %s', p_run_id, p_to_version, v_run.workflow_name);
  end if;
  if not runledger._migratable(v_run.status) then
    raise exception using errcode = 'RL005',
      message = format('migrate_run: run %s is %s; only PENDING, WAITING and DEAD_LETTER runs are migrated (%s)', p_run_id, v_run.status,
                       case when runledger.is_terminal(v_run.status) then 'a finished run stays on the version it finished on'
                            else 'a worker executes it now: migrate it once it waits or is released' end);
  end if;
  -- A migrated run goes on from its checkpoints, as a retried one does: never from an undone effect.
  v_undone := runledger._undone_operations(p_run_id);
  if v_undone <> '[]'::jsonb then
    raise exception using errcode = 'RL005', message = runledger._undone_refusal('migrate_run', p_run_id, v_undone)
      || format(' (fork_run''s version argument runs the fork on version %s)', p_to_version);
  end if;
  perform runledger._check_migration_served(v_run.workflow_name, v_run.workflow_version, p_to_version, 'migrate_run');
  if v_run.migrate_to = p_to_version then
    return false; -- already marked: the worker applies it once
  end if;
  update runledger.runs set migrate_to = p_to_version, updated_at = runledger.now() where run_id = p_run_id;
  insert into runledger.events (run_id, kind, detail, fencing_token)
  values (p_run_id, 'migration_requested',
          jsonb_build_object('from_version', v_run.workflow_version, 'to_version', p_to_version,
                             'status', v_run.status, 'manifest', v_run.version_manifest), v_run.fencing_token);
  -- Workers with the migration apply it at once instead of at their next sweep.
  perform pg_notify('runledger_migrate', v_run.workflow_name || '@' || v_run.workflow_version || '>' || p_to_version);
  return true;
end;
$function$;
COMMENT ON FUNCTION runledger._migrate_run(text,text) IS 'The action behind runledger.migrate_run (which records it in audit_log): Operator action: marks a PENDING, WAITING or DEAD_LETTER run to continue on version to_version of its workflow. A live worker that serves that version and has a migration from the run''s version applies it (the workflow''s migrate, in the run''s transaction) and records the event migrated with both manifests; a migrate that fails is recorded as migration_failed and the run is left as it was. Returns false when the run was already marked for that version. Refused (and nothing changed): an unknown run (RL002), a finished or executing run (RL005), a run whose compensations undid an operation it would replay (RL005: fork it instead, runledger._undone_operations), no live worker with the version and the migration (RL006).';

CREATE OR REPLACE FUNCTION runledger._migrate_runs(p_workflow text, p_from_version text, p_to_version text, p_limit integer DEFAULT NULL::integer)
 RETURNS TABLE(run_id text, marked boolean, reason text)
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
declare
  v_id     text;
  v_undone jsonb;
  v_seen   text[] := '{}';
  v_last   runledger.runs;
begin
  if p_limit is not null and p_limit < 1 then
    raise exception using errcode = 'RL003', message = format('migrate_runs: limit must be >= 1 (or null for all), not %s', p_limit);
  end if;
  if p_from_version = p_to_version then
    raise exception using errcode = 'RL003', message = 'migrate_runs: from_version and to_version are the same';
  end if;
  perform runledger._check_migration_served(p_workflow, p_from_version, p_to_version, 'migrate_runs');
  for v_id in
    select r.run_id from runledger.runs r
     where r.workflow_name = p_workflow and r.workflow_version = p_from_version
       and runledger._migratable(r.status) and r.migrate_to is distinct from p_to_version
     order by r.created_at, r.run_id
     limit p_limit
     for update skip locked
  loop
    v_seen := v_seen || v_id;
    v_undone := runledger._undone_operations(v_id);
    if v_undone <> '[]'::jsonb then
      return query select v_id, false, format('compensations undid %s: fork it from step %s instead',
        (select string_agg(u->>'name', ', ' order by (u->>'seq')::int) from jsonb_array_elements(v_undone) u), v_undone->0->>'seq');
      continue;
    end if;
    perform runledger._migrate_run(v_id, p_to_version);
    return query select v_id, true, null::text;
  end loop;
  -- The runs SKIP LOCKED passed over: those of the selection another transaction held locked.
  -- With a limit that was reached, the ones before the last run taken; otherwise all of them
  -- (at most the part of the limit left). Read without a lock: they may have changed since.
  select * into v_last from runledger.runs r where r.run_id = v_seen[cardinality(v_seen)];
  return query
    select r.run_id, false, 'locked by another transaction at that moment: not marked; call migrate_runs again'::text
      from runledger.runs r
     where r.workflow_name = p_workflow and r.workflow_version = p_from_version
       and runledger._migratable(r.status) and r.migrate_to is distinct from p_to_version
       and not (r.run_id = any(v_seen))
       and (p_limit is null or cardinality(v_seen) < p_limit or (r.created_at, r.run_id) < (v_last.created_at, v_last.run_id))
     order by r.created_at, r.run_id
     limit case when p_limit is null or cardinality(v_seen) >= p_limit then null else p_limit - cardinality(v_seen) end;
end;
$function$;
COMMENT ON FUNCTION runledger._migrate_runs(text,text,text,integer) IS 'The action behind runledger.migrate_runs (which records it in audit_log): Operator action: migrate_run for the PENDING, WAITING and DEAD_LETTER runs of workflow@from_version, oldest first, at most limit of them (the canary form: migrate a few, watch them, then the rest with limit null). Returns a row per run of the selection: marked true for each run it marked, false with the reason for each it did not: a run whose compensations undid an operation (fork it instead), or one another transaction held locked at that moment (a claim, a signal, an open transaction: not waited for; call again).';

CREATE OR REPLACE FUNCTION runledger._migration_failed(p_run_id text, p_to_version text, p_error jsonb, p_worker_id text)
 RETURNS void
 LANGUAGE sql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
  with cleared as (
    update runledger.runs r set migrate_to = null
     where r.run_id = p_run_id and r.migrate_to = p_to_version
    returning r.run_id, r.workflow_version, r.fencing_token)
  insert into runledger.events (run_id, kind, detail, fencing_token)
  select c.run_id, 'migration_failed',
         jsonb_build_object('from_version', c.workflow_version, 'to_version', p_to_version, 'error', p_error, 'worker', p_worker_id),
         c.fencing_token
    from cleared c
$function$;
COMMENT ON FUNCTION runledger._migration_failed(text,text,jsonb,text) IS 'A worker''s migrator, after rolling back: the migration of the run to to_version failed (its migrate threw, or returned what cannot be written). Clears the mark and records the event migration_failed with the error; the run is left as it was.';

CREATE OR REPLACE FUNCTION runledger._ms_after(p_from timestamp with time zone, p_ms numeric, p_what text)
 RETURNS timestamp with time zone
 LANGUAGE plpgsql
 STABLE
AS $function$
begin
  if p_ms is null then
    return null;
  end if;
  -- NaN compares above every number, so it fails the upper bound. 2^53 - 1 is the largest
  -- whole number a JSON number (a JavaScript one) holds exactly: about 285,000 years.
  if not (p_ms >= 0 and p_ms <= 9007199254740991) then
    raise exception using errcode = 'RL003',
      message = format('%s: %s ms is not a duration (milliseconds from 0 to 9007199254740991, about 285,000 years)', p_what, p_ms);
  end if;
  -- make_interval does not check its range on every server: the bound is checked here,
  -- against the last instant timestamptz holds (294276-12-31, 9224318016000 s after 1970).
  if extract(epoch from p_from) * 1000 + p_ms >= 9224318016000000 then
    raise exception using errcode = 'RL003',
      message = format('%s: %s ms after %s is later than any time PostgreSQL holds (294276-12-31)', p_what, p_ms, p_from);
  end if;
  return p_from + make_interval(secs => p_ms / 1000.0);
end;
$function$;
COMMENT ON FUNCTION runledger._ms_after(timestamp with time zone,numeric,text) IS 'p_from plus p_ms milliseconds (null for a null p_ms). RL003, naming p_what, for a p_ms that is negative, NaN or over 9007199254740991 (2^53 - 1), or a result past the last time timestamptz holds (294276-12-31): every duration the engine turns into a time goes through it.';

CREATE OR REPLACE FUNCTION runledger._new_id()
 RETURNS text
 LANGUAGE plpgsql
AS $function$
declare
  v_ms   bigint := (extract(epoch from clock_timestamp()) * 1000)::bigint;
  v_rand bytea  := uuid_send(gen_random_uuid());
begin
  -- Bytes 1-6 and 11-12 of a version 4 UUID are all random (7 and 9 carry its version and variant).
  return runledger._base32_10(v_ms) || upper(encode(substring(v_rand from 1 for 6) || substring(v_rand from 11 for 2), 'hex'));
end;
$function$;
COMMENT ON FUNCTION runledger._new_id() IS 'A new ULID (26 characters of Crockford base32: 10 of milliseconds, then 16 of randomness written as 64 random bits in hex) for ids created in SQL.';

CREATE OR REPLACE FUNCTION runledger._no_charge(p_charge jsonb)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
  select p_charge is null or p_charge = '0'::jsonb or p_charge = '{}'::jsonb or jsonb_typeof(p_charge) = 'null'
$function$;
COMMENT ON FUNCTION runledger._no_charge(jsonb) IS 'True when a charge charges nothing: absent, null, 0 or {}.';

CREATE OR REPLACE FUNCTION runledger._operation_begin(p_run_id text, p_token bigint, p_seq integer, p_name text, p_key text, p_compensable boolean, p_again boolean)
 RETURNS TABLE(operation_id text, status text, attempts integer, idempotency_key text, result jsonb, error jsonb)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_run   runledger.runs := runledger._fence(p_run_id, p_token);
  v_op    runledger.operations;
  v_prior runledger.operations;
  v_now   timestamptz := runledger.now();
begin
  select * into v_op from runledger.operations o where o.run_id = p_run_id and o.seq = p_seq for update;
  if not found then
    if v_run.version_manifest ? 'forked_from' then
      -- A fork: has a run it descends from used this key? A succeeded (and not compensated)
      -- operation is reused; otherwise the newest one, nearest ancestor first, is attempted again.
      with recursive lineage (run_id, depth) as (
        select v_run.version_manifest->>'forked_from', 1
        union all
        select r.version_manifest->>'forked_from', l.depth + 1
          from lineage l join runledger.runs r on r.run_id = l.run_id
         where r.version_manifest ? 'forked_from' and l.depth < 1000)
      select o.* into v_prior
        from lineage l join runledger.operations o on o.run_id = l.run_id
       where o.idempotency_key = p_key
       order by (o.status = 'SUCCEEDED' and o.compensation_status is null) desc, l.depth, o.started_at desc
       limit 1;
    end if;
    if v_prior.operation_id is not null and v_prior.status = 'SUCCEEDED' and v_prior.compensation_status is null then
      -- The key says the effect happened once: the fork gets its result without a call. The
      -- effect stays the ancestor's, so the fork does not compensate it (compensable false).
      insert into runledger.operations (operation_id, run_id, seq, name, idempotency_key, status, external_resource_id, result,
                                        attempts, compensable, finished_at, prior_operation_id)
      values (runledger._new_id(), p_run_id, p_seq, p_name, p_key, 'SUCCEEDED', v_prior.external_resource_id, v_prior.result,
              0, false, v_now, v_prior.operation_id)
      returning * into v_op;
      insert into runledger.events (run_id, kind, detail, fencing_token, at)
      values (p_run_id, 'operation_reused', jsonb_build_object('operation_id', v_op.operation_id, 'name', p_name, 'key', p_key,
              'from_operation_id', v_prior.operation_id, 'from_run_id', v_prior.run_id), p_token, v_now);
    else
      insert into runledger.operations (operation_id, run_id, seq, name, idempotency_key, status, compensable, prior_operation_id)
      values (runledger._new_id(), p_run_id, p_seq, p_name, p_key, 'STARTED', p_compensable, v_prior.operation_id)
      returning * into v_op;
      insert into runledger.events (run_id, kind, detail, fencing_token, at)
      values (p_run_id, 'operation_started', jsonb_strip_nulls(jsonb_build_object('operation_id', v_op.operation_id, 'name', p_name,
              'key', p_key, 'prior_operation_id', v_prior.operation_id)), p_token, v_now);
      if v_prior.operation_id is not null then
        -- The ancestor's ledger shows that its key was used again, and by whom.
        insert into runledger.events (run_id, kind, detail, at)
        values (v_prior.run_id, 'operation_attempted_by_fork', jsonb_build_object('operation_id', v_prior.operation_id,
                'status', v_prior.status, 'fork', p_run_id, 'fork_operation_id', v_op.operation_id), v_now);
      end if;
    end if;
  elsif (p_again and v_op.status in ('STARTED', 'UNKNOWN', 'FAILED')) or v_op.status = 'PLANNED' then
    -- Called again on purpose (declared idempotent, a retry, or PLANNED again by retry_run): same key, next attempt.
    update runledger.operations o set status = 'STARTED', attempts = o.attempts + 1, updated_at = v_now, error = null
     where o.operation_id = v_op.operation_id returning * into v_op;
    insert into runledger.events (run_id, kind, detail, fencing_token, at)
    values (p_run_id, 'operation_retried', jsonb_build_object('operation_id', v_op.operation_id, 'attempt', v_op.attempts), p_token, v_now);
  elsif v_op.status = 'STARTED' then
    -- Started by an execution that never recorded the outcome: it may or may not have happened.
    update runledger.operations o set status = 'UNKNOWN', updated_at = v_now where o.operation_id = v_op.operation_id returning * into v_op;
    insert into runledger.events (run_id, kind, detail, fencing_token, at)
    values (p_run_id, 'operation_unknown', jsonb_build_object('operation_id', v_op.operation_id, 'name', p_name, 'key', v_op.idempotency_key), p_token, v_now);
    return query select v_op.operation_id, 'UNKNOWN_NOW'::text, v_op.attempts, v_op.idempotency_key, v_op.result, v_op.error;
    return;
  end if;
  return query select v_op.operation_id, v_op.status, v_op.attempts, v_op.idempotency_key, v_op.result, v_op.error;
end;
$function$;
COMMENT ON FUNCTION runledger._operation_begin(text,bigint,integer,text,text,boolean,boolean) IS 'Fenced. First call: records the intent (STARTED, key, attempt 1) and commits before the external call; in a fork whose ancestor used the key, reuses its SUCCEEDED result (no call) or links the new attempt to it (prior_operation_id). A key another run used raises 23505. On replay a STARTED row becomes UNKNOWN (status UNKNOWN_NOW, with an event). p_again, or a PLANNED row (put back by retry_run): the caller will call again with the same key (STARTED, attempt + 1). Otherwise returns the row as it stands.';

CREATE OR REPLACE FUNCTION runledger._operation_checkpoint(p_run_id text, p_token bigint, p_seq integer, p_name text, p_operation_id text, p_status text, p_output jsonb, p_error jsonb, p_external_resource_id text, p_attempts integer, p_started_ms_ago bigint, p_charge jsonb)
 RETURNS TABLE(pid integer, run_status text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
begin
  -- The outcome in the ledger and the step checkpoint commit together. UNKNOWN: the step fails
  -- (reconcile gave an invalid answer) while the ledger row stays UNKNOWN; the error goes into events.
  if p_status = 'UNKNOWN' then
    insert into runledger.events (run_id, kind, detail, fencing_token)
    values (p_run_id, 'operation_reconcile_invalid', jsonb_build_object('operation_id', p_operation_id, 'name', p_name, 'error', p_error), p_token);
  else
    perform runledger._operation_finish(p_run_id, p_token, p_operation_id, p_status, p_output->'value', p_error, p_external_resource_id, null);
  end if;
  return query select * from runledger._checkpoint(p_run_id, p_token, p_seq, p_name, 'operation',
    case when p_status = 'SUCCEEDED' then 'SUCCEEDED' else 'FAILED' end, p_output, p_error, p_attempts, p_started_ms_ago, p_charge);
end;
$function$;
COMMENT ON FUNCTION runledger._operation_checkpoint(text,bigint,integer,text,text,text,jsonb,jsonb,text,integer,bigint,jsonb) IS 'Fenced: records an operation''s outcome in the ledger and its step checkpoint in one transaction. p_status UNKNOWN (an invalid reconcile answer): the step checkpoint is FAILED with p_error, the ledger row stays UNKNOWN and an operation_reconcile_invalid event holds the error.';

CREATE OR REPLACE FUNCTION runledger._operation_finish(p_run_id text, p_token bigint, p_operation_id text, p_status text, p_result jsonb, p_error jsonb, p_external_resource_id text, p_resolved_by text)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
begin
  perform runledger._fence(p_run_id, p_token);
  update runledger.operations
     set status = p_status, result = p_result, error = p_error, updated_at = runledger.now(), finished_at = runledger.now(),
         external_resource_id = coalesce(p_external_resource_id, external_resource_id),
         resolved_by = coalesce(p_resolved_by, resolved_by)
   where operation_id = p_operation_id and run_id = p_run_id;
  insert into runledger.events (run_id, kind, detail, fencing_token)
  values (p_run_id, 'operation_' || lower(p_status),
          jsonb_strip_nulls(jsonb_build_object('operation_id', p_operation_id, 'resolved_by', p_resolved_by, 'error', p_error)), p_token);
end;
$function$;
COMMENT ON FUNCTION runledger._operation_finish(text,bigint,text,text,jsonb,jsonb,text,text) IS 'Fenced: records an operation''s outcome; called in the same transaction as the step checkpoint that follows it.';

CREATE OR REPLACE FUNCTION runledger._operation_park(p_run_id text, p_token bigint, p_seq integer, p_operation_id text, p_retry_in_ms bigint)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_run runledger.runs := runledger._fence(p_run_id, p_token);
  v_wake timestamptz := runledger._ms_after(runledger.now(), p_retry_in_ms, '_operation_park: p_retry_in_ms');
begin
  -- Never a silent retry of a call that may have happened: the run waits (holding nothing)
  -- for resolve_operation, or until the next reconcile attempt when a reconciler said "unknown".
  update runledger.runs
     set status = 'WAITING', wait_kind = 'reconcile', wait_key = p_operation_id, wake_at = least(v_wake, v_run.deadline_at),
         lease_owner = null, lease_expires_at = null, updated_at = runledger.now()
   where run_id = p_run_id;
  perform runledger._slot_freed(p_run_id);
  insert into runledger.events (run_id, kind, detail, fencing_token)
  values (p_run_id, 'waiting_for_reconcile', jsonb_build_object('operation_id', p_operation_id, 'seq', p_seq, 'retry_in_ms', p_retry_in_ms), p_token);
  if least(v_wake, v_run.deadline_at) is not null then
    perform runledger._dispatch(p_run_id, v_run.queue_name,
      greatest(0, ceil(extract(epoch from least(v_wake, v_run.deadline_at) - runledger.now()) * 1000))::bigint);
  end if;
end;
$function$;
COMMENT ON FUNCTION runledger._operation_park(text,bigint,integer,text,bigint) IS 'Fenced: an UNKNOWN operation that cannot be settled automatically parks the run WAITING (wait_kind reconcile) until resolve_operation, or until p_retry_in_ms for the next reconcile.';

CREATE OR REPLACE FUNCTION runledger._owner_settings_changed()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
begin
  if tg_op = 'UPDATE' and old is not distinct from new then
    return null;
  end if;
  perform runledger._audit('owner_settings', null, null,
                           jsonb_build_object('old', to_jsonb(old) - 'one', 'new', to_jsonb(new) - 'one'), null);
  return null;
end;
$function$;
COMMENT ON FUNCTION runledger._owner_settings_changed() IS 'Trigger function of owner_settings_audit: records a change of runledger.owner_settings in audit_log (action owner_settings, the old and new values, by the login that made it).';

CREATE OR REPLACE FUNCTION runledger._prune(p_older_than interval)
 RETURNS bigint
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
declare
  v_cutoff timestamptz := runledger.now() - p_older_than;
  v_count  bigint;
begin
  if p_older_than is null or p_older_than < interval '0' then
    raise exception using errcode = 'RL003', message = 'prune: older_than must be an interval >= 0';
  end if;
  -- Steps, events, operations, signals, approvals and progress go with their run (on delete cascade).
  with gone as (
    delete from runledger.runs r
     where runledger.is_terminal(r.status) and r.finished_at < v_cutoff
    returning 1)
  select count(*) into v_count from gone;
  delete from runledger.workers w where w.stopped_at < v_cutoff;
  return v_count;
end;
$function$;
COMMENT ON FUNCTION runledger._prune(interval) IS 'The action behind runledger.prune (which records it in audit_log): Deletes finished runs (terminal, finished before now - older_than) with their steps, events, operations, signals and approvals, and workers stopped before then. Returns how many runs it removed.';

CREATE OR REPLACE FUNCTION runledger._prune_artifact_blobs()
 RETURNS bigint
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
declare
  v_count bigint;
begin
  -- A blob being referred to right now (FOR KEY SHARE, by a transaction recording a row) is skipped.
  with gone as (
    delete from runledger.artifact_blobs b
     where b.sha256 in (
       select o.sha256 from runledger.artifact_blobs o
        where not exists (select 1 from runledger.artifacts a where a.blob = o.sha256)
        for update skip locked)
    returning 1)
  select count(*) into v_count from gone;
  return v_count;
end;
$function$;
COMMENT ON FUNCTION runledger._prune_artifact_blobs() IS 'The action behind runledger.prune_artifact_blobs (which records it in audit_log): Operator action: deletes the blobs no artifact row refers to any more (their runs were pruned); returns how many. A blob being recorded right now is skipped.';

CREATE OR REPLACE FUNCTION runledger._prune_due(p_batch integer DEFAULT 1000, p_dry_run boolean DEFAULT false)
 RETURNS TABLE(kind text, removed bigint)
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
declare
  v_now    timestamptz := runledger.now();
  v_kind   text;
  v_rule   runledger.retention;
  v_others text[];
  v_cutoff timestamptz;
  v_left   bigint;
  v_n      bigint;
  v_total  bigint;
  v_id     text;
  v_run    runledger.runs;
  v_ids    text[] := '{}';
begin
  if p_batch is null or p_batch < 1 then
    raise exception using errcode = 'RL003', message = 'prune_due: batch must be a whole number >= 1';
  end if;
  -- Keys first (a cleared key lets its run go in the same call), the run's parts, the runs, the rest.
  foreach v_kind in array array['idempotency', 'events', 'signals', 'streams', 'runs', 'session_entries', 'audit_log'] loop
    v_total := 0;
    -- The workflows with a rule of their own for this kind are not under its default.
    v_others := array(select r.workflow_name from runledger.retention r where r.kind = v_kind and r.workflow_name is not null);
    for v_rule in
      select * from runledger.retention r where r.kind = v_kind and r.keep is not null order by r.workflow_name nulls last
    loop
      v_cutoff := v_now - v_rule.keep;
      -- Dry-run counts everything due; a batch stops at p_batch rows per kind.
      v_left := case when p_dry_run then null else p_batch - v_total end;
      exit when v_left is not null and v_left <= 0;
      v_n := 0;
      if v_kind = 'idempotency' then
        if p_dry_run then
          select count(*) into v_n from runledger.runs r
           where r.idempotency_key is not null and r.status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER')
             and r.finished_at < v_cutoff
             and (r.workflow_name = v_rule.workflow_name or (v_rule.workflow_name is null and r.workflow_name <> all (v_others)));
        else
          with due as (
            select r.run_id from runledger.runs r
             where r.idempotency_key is not null and r.status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER')
               and r.finished_at < v_cutoff
               and (r.workflow_name = v_rule.workflow_name or (v_rule.workflow_name is null and r.workflow_name <> all (v_others)))
             limit v_left
               for no key update skip locked),
          cleared as (
            update runledger.runs r set idempotency_key = null from due where r.run_id = due.run_id returning 1)
          select count(*) into v_n from cleared;
        end if;
      elsif v_kind = 'events' then
        if p_dry_run then
          select count(*) into v_n from runledger.runs r join runledger.events e on e.run_id = r.run_id
           where r.status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER') and r.finished_at < v_cutoff
             and (r.workflow_name = v_rule.workflow_name or (v_rule.workflow_name is null and r.workflow_name <> all (v_others)));
        else
          with due as (
            select e.run_id, e.event_id from runledger.runs r join runledger.events e on e.run_id = r.run_id
             where r.status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER') and r.finished_at < v_cutoff
               and (r.workflow_name = v_rule.workflow_name or (v_rule.workflow_name is null and r.workflow_name <> all (v_others)))
             limit v_left
               for update of e skip locked),
          gone as (delete from runledger.events e using due where e.run_id = due.run_id and e.event_id = due.event_id returning 1)
          select count(*) into v_n from gone;
        end if;
      elsif v_kind = 'signals' then
        if p_dry_run then
          select count(*) into v_n from runledger.runs r join runledger.signals s on s.run_id = r.run_id
           where r.status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER') and r.finished_at < v_cutoff
             and (r.workflow_name = v_rule.workflow_name or (v_rule.workflow_name is null and r.workflow_name <> all (v_others)));
        else
          with due as (
            select s.signal_id from runledger.runs r join runledger.signals s on s.run_id = r.run_id
             where r.status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER') and r.finished_at < v_cutoff
               and (r.workflow_name = v_rule.workflow_name or (v_rule.workflow_name is null and r.workflow_name <> all (v_others)))
             limit v_left
               for update of s skip locked),
          gone as (delete from runledger.signals g using due where g.signal_id = due.signal_id returning 1)
          select count(*) into v_n from gone;
        end if;
      elsif v_kind = 'streams' then
        -- Chunks first, then the ends of streams whose chunks are all gone: both counted.
        if p_dry_run then
          select (select count(*) from runledger.runs r join runledger.stream_chunks c on c.run_id = r.run_id
                   where r.status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER') and r.finished_at < v_cutoff
                     and (r.workflow_name = v_rule.workflow_name or (v_rule.workflow_name is null and r.workflow_name <> all (v_others))))
               + (select count(*) from runledger.runs r join runledger.stream_ends e on e.run_id = r.run_id
                   where r.status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER') and r.finished_at < v_cutoff
                     and (r.workflow_name = v_rule.workflow_name or (v_rule.workflow_name is null and r.workflow_name <> all (v_others))))
            into v_n;
        else
          with due as (
            select c.run_id, c.topic, c."offset" from runledger.runs r join runledger.stream_chunks c on c.run_id = r.run_id
             where r.status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER') and r.finished_at < v_cutoff
               and (r.workflow_name = v_rule.workflow_name or (v_rule.workflow_name is null and r.workflow_name <> all (v_others)))
             limit v_left
               for update of c skip locked),
          gone as (
            delete from runledger.stream_chunks c using due
             where c.run_id = due.run_id and c.topic = due.topic and c."offset" = due."offset" returning 1)
          select count(*) into v_n from gone;
          if v_n < v_left then
            with due as (
              select e.run_id, e.topic from runledger.runs r join runledger.stream_ends e on e.run_id = r.run_id
               where r.status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER') and r.finished_at < v_cutoff
                 and (r.workflow_name = v_rule.workflow_name or (v_rule.workflow_name is null and r.workflow_name <> all (v_others)))
                 and not exists (select 1 from runledger.stream_chunks c where c.run_id = e.run_id and c.topic = e.topic)
               limit v_left - v_n
                 for update of e skip locked),
            gone as (delete from runledger.stream_ends e using due where e.run_id = due.run_id and e.topic = due.topic returning 1)
            select v_n + count(*) into v_n from gone;
          end if;
        end if;
      elsif v_kind = 'runs' then
        if p_dry_run then
          select count(*) into v_n from runledger.runs r
           where r.status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER') and r.finished_at < v_cutoff
             and (r.workflow_name = v_rule.workflow_name or (v_rule.workflow_name is null and r.workflow_name <> all (v_others)))
             and not exists (select 1 from runledger.runs c where c.parent_run_id = r.run_id and not runledger.is_terminal(c.status))
             and not exists (select 1 from runledger.runs p where p.run_id = r.parent_run_id and not runledger.is_terminal(p.status))
             and not (r.idempotency_key is not null and runledger._retention_key_held(r.workflow_name, r.finished_at))
             and not (exists (select 1 from runledger.runs f
                               where f.version_manifest ? 'forked_from' and f.version_manifest->>'forked_from' = r.run_id)
                      and runledger._retention_fork_live(r.run_id));
        else
          -- One run at a time, from a scan without a sort that stops at p_batch runs: the
          -- protections (a few index probes each) are checked only for the runs it gets to.
          -- FOR UPDATE SKIP LOCKED conflicts with the FOR KEY SHARE of a fork_run or a
          -- child's start reading the run right now: that run is skipped, looked at next time.
          -- A protected run is passed over unlocked; a due one is locked, then checked again.
          for v_run in
            select r.* from runledger.runs r
             where r.status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER') and r.finished_at < v_cutoff
               and (r.workflow_name = v_rule.workflow_name or (v_rule.workflow_name is null and r.workflow_name <> all (v_others)))
          loop
            exit when v_n >= v_left;
            v_id := v_run.run_id;
            continue when exists (select 1 from runledger.runs c where c.parent_run_id = v_id and not runledger.is_terminal(c.status))
                       or exists (select 1 from runledger.runs p where p.run_id = v_run.parent_run_id and not runledger.is_terminal(p.status))
                       or (v_run.idempotency_key is not null and runledger._retention_key_held(v_run.workflow_name, v_run.finished_at))
                       or (exists (select 1 from runledger.runs f
                                    where f.version_manifest ? 'forked_from' and f.version_manifest->>'forked_from' = v_id)
                           and runledger._retention_fork_live(v_id));
            perform 1 from runledger.runs r
             where r.run_id = v_id and r.status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER')
               for update skip locked;
            continue when not found;
            -- Locked: a fork or child made while the scan ran has committed by now, and is seen.
            continue when exists (select 1 from runledger.runs c where c.parent_run_id = v_id and not runledger.is_terminal(c.status))
                       or (exists (select 1 from runledger.runs f
                                    where f.version_manifest ? 'forked_from' and f.version_manifest->>'forked_from' = v_id)
                           and runledger._retention_fork_live(v_id));
            v_ids := v_ids || v_id;
            v_n := v_n + 1;
          end loop;
          -- The runs are locked: one delete for all of them (and one pass of each cascade).
          delete from runledger.runs r where r.run_id = any (v_ids);
          v_ids := '{}';
        end if;
      elsif v_kind = 'session_entries' then
        -- Whole idle sessions (free, nobody queued): a batch takes sessions until their
        -- entries reach p_batch (at least one session, however long its history).
        -- A session is keyed by its id and tenant.
        if p_dry_run then
          select coalesce(sum(s.entry_count), 0) into v_n from runledger.sessions s
           where s.holder_run_id is null and s.updated_at < v_cutoff
             and not exists (select 1 from runledger.session_waiters w where w.session_id = s.session_id and w.tenant_id = s.tenant_id);
        else
          with idle as (
            select s.session_id, s.tenant_id, s.entry_count from runledger.sessions s
             where s.holder_run_id is null and s.updated_at < v_cutoff
               and not exists (select 1 from runledger.session_waiters w where w.session_id = s.session_id and w.tenant_id = s.tenant_id)
             order by s.updated_at
             limit v_left
               for update skip locked),
          due as (
            select i.session_id, i.tenant_id, i.entry_count,
                   sum(i.entry_count) over (order by i.session_id, i.tenant_id) as running
              from idle i),
          gone as (
            delete from runledger.sessions s using due
             where s.session_id = due.session_id and s.tenant_id = due.tenant_id
               and (due.running <= v_left or due.running = due.entry_count)
            returning s.entry_count)
          select coalesce(sum(g.entry_count), 0) into v_n from gone g;
        end if;
      elsif v_kind = 'audit_log' then
        -- Never younger than the owner's floor, whatever the rule says (a rule set before the
        -- floor was raised); the records of retention changes stay whatever their age, so a
        -- rule that removes the log cannot remove the record of its own making.
        v_cutoff := v_now - greatest(v_rule.keep, runledger._audit_log_min_keep());
        if p_dry_run then
          select count(*) into v_n from runledger.audit_log a
           where a.at < v_cutoff and a.action not in ('set_retention', 'clear_retention', 'owner_settings');
        else
          with due as (
            select a.audit_id from runledger.audit_log a
             where a.at < v_cutoff and a.action not in ('set_retention', 'clear_retention', 'owner_settings')
             order by a.at limit v_left for update skip locked),
          gone as (delete from runledger.audit_log a using due where a.audit_id = due.audit_id returning 1)
          select count(*) into v_n from gone;
        end if;
      end if;
      v_total := v_total + v_n;
    end loop;
    kind := v_kind;
    removed := v_total;
    return next;
  end loop;
end;
$function$;
COMMENT ON FUNCTION runledger._prune_due(integer,boolean) IS 'The action behind runledger.prune_due (which records it in audit_log): applies runledger.retention, one batch of at most p_batch rows per kind (idempotency keys cleared, events, signals, stream chunks and ends, runs, session entries, audit records); with p_dry_run, counts everything due and changes nothing. Returns one row per kind.';

CREATE OR REPLACE FUNCTION runledger._pure_functions()
 RETURNS text[]
 LANGUAGE sql
 IMMUTABLE
AS $function$
  select array['now', 'is_terminal', 'run_transitions', 'termination_reasons', 'step_kinds', 'wait_kinds']
$function$;
COMMENT ON FUNCTION runledger._pure_functions() IS 'The functions of role_functions that read no table and change nothing: they run as their caller with no settings (not SECURITY DEFINER, no fixed search_path), so the planner inlines them into the statements that call them.';

CREATE OR REPLACE FUNCTION runledger._queue_limited(p_queue text)
 RETURNS boolean
 LANGUAGE plpgsql
 STABLE PARALLEL SAFE
AS $function$
begin
  return exists (select 1 from runledger.queues q
                  where q.name = p_queue
                    and (q.concurrency is not null or q.per_key_concurrency is not null
                         or q.rate_limit_max is not null or q.paused));
end;
$function$;
COMMENT ON FUNCTION runledger._queue_limited(text) IS 'True when the queue has a limit or is paused: its runs go through admission.';

CREATE OR REPLACE FUNCTION runledger._random_40(p_second boolean DEFAULT false)
 RETURNS bigint
 LANGUAGE sql
AS $function$
  select ('x' || encode(substring(uuid_send(gen_random_uuid()) from case when p_second then 11 else 1 end for 5), 'hex'))::bit(40)::bigint
$function$;
COMMENT ON FUNCTION runledger._random_40(boolean) IS 'A random whole number below 2^40 (from gen_random_uuid).';

CREATE OR REPLACE FUNCTION runledger._rate_limit_acquire(p_run_id text, p_token bigint, p_seq integer, p_key text)
 RETURNS TABLE(granted boolean, wait_ms bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_now   timestamptz;
  v_limit runledger.rate_limit_keys;
  v_since timestamptz;
  v_ahead int;
  v_used  int := 0;
  v_place int;
  v_at    timestamptz;
  v_until timestamptz;
  v_hold  interval;
begin
  perform runledger._fence(p_run_id, p_token);
  select * into v_limit from runledger.rate_limit_keys k where k.key = p_key for update;
  -- Read after the lock (runledger.now() is the clock, not the transaction's start): a caller
  -- that waited for the lock counts the calls let through meanwhile.
  v_now := runledger.now();
  if v_limit.key is null then
    delete from runledger.rate_limit_waiters w where w.run_id = p_run_id and w.seq = p_seq;
    return query select true, 0::bigint;
    return;
  end if;
  -- A call holds its place for per and a tenth more (at most a second): it reaches the
  -- provider a little after its permit, later when the worker's event loop is busy, and
  -- without the margin two calls a window apart by their permits could land closer at the
  -- provider. (The view rate_limits counts the same way.)
  v_hold := v_limit.per + least(v_limit.per * 0.1, interval '1 second');
  -- A waiter whose run ended without its permit (cancelled while parked, past its deadline)
  -- or is gone (pruned) waits for nothing: its row goes as it is met.
  delete from runledger.rate_limit_waiters w
   where w.key = p_key
     and not exists (select 1 from runledger.runs r where r.run_id = w.run_id and not runledger.is_terminal(r.status));
  -- Those ahead: callers of the key waiting since before this one (all of them, for a new
  -- caller), whose runs go on and who came back when their place was due (one gone for
  -- longer than a window, its worker stopped or its queue paused, holds up nobody).
  select w.since into v_since from runledger.rate_limit_waiters w where w.run_id = p_run_id and w.seq = p_seq;
  select count(*) into v_ahead from runledger.rate_limit_waiters w join runledger.runs r on r.run_id = w.run_id
   where w.key = p_key and (w.run_id, w.seq) <> (p_run_id, p_seq) and (v_since is null or w.since < v_since)
     and w.until > v_now - coalesce(v_hold, interval '1 second') and not runledger.is_terminal(r.status);
  if v_limit.paused_until > v_now then
    v_until := v_limit.paused_until + case when v_limit.max_calls is null then interval '0' else v_hold * (v_ahead / v_limit.max_calls) end;
  elsif v_limit.max_calls is not null then
    delete from runledger.rate_limit_calls c where c.key = p_key and c.at <= v_now - v_hold;
    select count(*) into v_used from runledger.rate_limit_calls c where c.key = p_key;
    if v_used + v_ahead >= v_limit.max_calls then
      -- This caller's place is the (v_place + 1)-th to free. The max_calls places free once a
      -- window, round after round: those of the calls in the window a window after each
      -- call, oldest first, and the free ones (taken now by those ahead) a window from now.
      v_place := v_used + v_ahead - v_limit.max_calls;
      if v_place % v_limit.max_calls < v_used then
        select c.at into v_at from runledger.rate_limit_calls c where c.key = p_key order by c.at offset v_place % v_limit.max_calls limit 1;
      else
        v_at := v_now;
      end if;
      v_until := v_at + v_hold * (1 + v_place / v_limit.max_calls);
    end if;
  end if;
  if v_until is null then
    if v_limit.max_calls is not null then
      insert into runledger.rate_limit_calls (key, at, run_id, seq) values (p_key, v_now, p_run_id, p_seq);
    end if;
    delete from runledger.rate_limit_waiters w where w.run_id = p_run_id and w.seq = p_seq;
    return query select true, 0::bigint;
    return;
  end if;
  insert into runledger.rate_limit_waiters (run_id, seq, key, since, until) values (p_run_id, p_seq, p_key, v_now, v_until)
  on conflict on constraint rate_limit_waiters_pkey do update set key = excluded.key, until = excluded.until;
  return query select false, greatest(1, ceil(extract(epoch from v_until - v_now) * 1000))::bigint;
end;
$function$;
COMMENT ON FUNCTION runledger._rate_limit_acquire(text,bigint,integer,text) IS 'Fenced: a permit for one attempt of the call at (run, seq) on a shared rate limit key, first come first served: granted (the call logged in rate_limit_calls) when the key is not paused and the places left in the window (max_calls, each held for per and a tenth more, at most a second) outnumber the callers waiting since before this one; else not granted, with the milliseconds until this caller''s place is due (counting those ahead) or the pause ends, and the caller kept in rate_limit_waiters (its first since kept, which holds its place in line). A waiter whose run ended, or who has not come back for a window after its place was due, is not counted ahead; the rows of waiters whose run ended or is gone are deleted as the key''s callers meet them. A key with no row is not limited.';

CREATE OR REPLACE FUNCTION runledger._rate_limit_pause(p_run_id text, p_token bigint, p_key text, p_ms bigint, p_reason jsonb)
 RETURNS timestamp with time zone
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_until timestamptz;
begin
  perform runledger._fence(p_run_id, p_token);
  v_until := runledger._ms_after(runledger.now(), p_ms, '_rate_limit_pause: p_ms');
  insert into runledger.rate_limit_keys as k (key, paused_until, pause_reason)
  values (p_key, v_until, p_reason || jsonb_build_object('run_id', p_run_id))
  on conflict (key) do update
     set paused_until = greatest(k.paused_until, excluded.paused_until),
         pause_reason = case when k.paused_until >= excluded.paused_until then k.pause_reason else excluded.pause_reason end,
         updated_at = runledger.now();
  insert into runledger.events (run_id, kind, detail, fencing_token)
  values (p_run_id, 'rate_limit_paused', jsonb_build_object('key', p_key, 'until', v_until, 'reason', p_reason), p_token);
  return (select paused_until from runledger.rate_limit_keys where key = p_key);
end;
$function$;
COMMENT ON FUNCTION runledger._rate_limit_pause(text,bigint,text,bigint,jsonb) IS 'Fenced: a call on a shared rate limit key failed with a Retry-After (RetryAfterError, or HTTP 429/503 carrying one): the key is paused for every run for p_ms from now (a longer pause already set stays), with the reason; recorded as the run''s event rate_limit_paused. Returns the key''s paused_until.';

CREATE OR REPLACE FUNCTION runledger._rate_limit_wait(p_run_id text, p_token bigint, p_seq integer, p_name text, p_kind text, p_attempt integer, p_key text, p_wait_ms bigint)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_run  runledger.runs := runledger._fence(p_run_id, p_token);
  v_wake timestamptz := runledger._ms_after(runledger.now(), p_wait_ms, '_rate_limit_wait: p_wait_ms');
begin
  -- attempt is the attempt already made: the one waiting for its permit is the next.
  insert into runledger.steps (run_id, seq, name, kind, status, output, attempts, started_at, finished_at, fencing_token)
  values (p_run_id, p_seq, p_name, p_kind, 'WAITING',
          jsonb_build_object('attempt', p_attempt - 1, 'wake_at', v_wake, 'rate_limit', p_key), p_attempt - 1,
          runledger.now(), runledger.now(), p_token)
  on conflict (run_id, seq) do update set output = excluded.output, attempts = excluded.attempts, fencing_token = excluded.fencing_token
   where runledger.steps.status = 'WAITING';
  if p_kind = 'operation' then
    -- The operation's intent (STARTED) was recorded but the call was not made: it waits for the
    -- permit, so the ledger says PLANNED (called when the run resumes), never UNKNOWN.
    update runledger.operations o set status = 'PLANNED', attempts = greatest(o.attempts - 1, 0), updated_at = runledger.now()
     where o.run_id = p_run_id and o.seq = p_seq and o.status = 'STARTED';
  end if;
  update runledger.runs
     set status = 'WAITING', wait_kind = 'rate_limit', wait_key = p_key, wake_at = least(v_wake, v_run.deadline_at),
         lease_owner = null, lease_expires_at = null, updated_at = runledger.now()
   where run_id = p_run_id;
  insert into runledger.events (run_id, kind, detail, fencing_token)
  values (p_run_id, 'rate_limit_wait', jsonb_build_object('seq', p_seq, 'name', p_name, 'key', p_key, 'wake_at', v_wake), p_token);
  perform runledger._slot_freed(p_run_id);
  perform runledger._dispatch(p_run_id, v_run.queue_name,
    greatest(0, ceil(extract(epoch from least(v_wake, v_run.deadline_at) - runledger.now()) * 1000))::bigint);
end;
$function$;
COMMENT ON FUNCTION runledger._rate_limit_wait(text,bigint,integer,text,text,integer,text,bigint) IS 'Fenced: a step position refused a permit for longer than it waits in memory becomes a durable wait (wait_kind rate_limit, wait_key the key): the step keeps a WAITING row with the attempt reached, and the run waits, holding no worker, until the permit is expected; it then asks again. An operation''s STARTED ledger row (its call not made) goes back to PLANNED.';

CREATE OR REPLACE FUNCTION runledger._record_artifact(p_run_id text, p_position integer, p_name text, p_kind text, p_sha256 text, p_size bigint, p_content bytea, p_ref text)
 RETURNS jsonb
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_row runledger.artifacts;
begin
  if p_content is not null then
    if encode(sha256(p_content), 'hex') <> p_sha256 then
      raise exception using errcode = 'RL003', message = format('artifact %s: the content does not have sha256 %s', p_name, p_sha256);
    end if;
    insert into runledger.artifact_blobs (sha256, size, content) values (p_sha256, octet_length(p_content), p_content)
    on conflict (sha256) do nothing;
  end if;
  if p_kind = 'value' then
    select * into v_row from runledger.artifacts a where a.run_id = p_run_id and a.blob = p_sha256 and a.kind = 'value';
    if found then
      return to_jsonb(v_row);
    end if;
  end if;
  insert into runledger.artifacts (artifact_id, run_id, name, kind, sha256, size, blob, ref, step_position)
  values (runledger._new_id(), p_run_id, p_name, p_kind, p_sha256, p_size,
          case when p_ref is null then p_sha256 end, p_ref, p_position)
  returning * into v_row;
  return to_jsonb(v_row);
end;
$function$;
COMMENT ON FUNCTION runledger._record_artifact(text,integer,text,text,text,bigint,bytea,text) IS 'Records an artifact row of a run (kind artifact or value) and stores its content as a blob unless it is already stored (p_content null: the caller holds it, _artifact_blob_held) or it is a reference (p_ref). A value already recorded for the run and content is returned as it is. Content that does not hash to p_sha256: RL003.';

CREATE OR REPLACE FUNCTION runledger._record_retry(p_run_id text, p_token bigint, p_seq integer, p_name text, p_attempt integer, p_error jsonb, p_delay_ms bigint)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_run runledger.runs := runledger._fence(p_run_id, p_token);
begin
  if v_run.retry_budget is not null and v_run.retries_used + 1 > v_run.retry_budget then
    insert into runledger.events (run_id, kind, detail, fencing_token)
    values (p_run_id, 'retry_budget_exhausted', jsonb_build_object('seq', p_seq, 'name', p_name, 'attempt', p_attempt,
            'retries_used', v_run.retries_used, 'retry_budget', v_run.retry_budget, 'error', p_error), p_token);
    return false;
  end if;
  update runledger.runs set retries_used = retries_used + 1 where run_id = p_run_id;
  insert into runledger.events (run_id, kind, detail, fencing_token)
  values (p_run_id, 'attempt_failed', jsonb_build_object('seq', p_seq, 'name', p_name, 'attempt', p_attempt, 'error', p_error,
          'retry_in_ms', p_delay_ms), p_token);
  return true;
end;
$function$;
COMMENT ON FUNCTION runledger._record_retry(text,bigint,integer,text,integer,jsonb,bigint) IS 'Fenced: records a failed attempt of a step (its error and the backoff before the next) and spends one retry of the run''s retry budget; false when the budget is used up (the step then fails).';

CREATE OR REPLACE FUNCTION runledger._recover_expired(p_limit integer DEFAULT 1000)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_now   timestamptz := runledger.now();
  v_run   runledger.runs;
  v_count int := 0;
  v_attempts int;
  v_error    jsonb;
begin
  -- SKIP LOCKED: several workers sweep at once without blocking on each other or on
  -- a run whose owner is committing a checkpoint right now.
  for v_run in
    select * from runledger.runs r
     where r.status in ('RUNNING', 'CANCELLING') and r.lease_expires_at < v_now
     order by r.lease_expires_at
     limit p_limit
     for update skip locked
  loop
    v_count := v_count + 1;
    if v_run.status = 'CANCELLING' and runledger._compensations_due(v_run.run_id)
       and v_run.recovery_attempts < v_run.max_recovery_attempts then
      -- Its owner died while cancelling (or stopping), with compensations still to run:
      -- another worker takes the run (still CANCELLING) and finishes them; it never
      -- resumes the work. Each expiry counts an attempt, so a compensation that kills its
      -- worker every time is given up on after max_recovery_attempts (below).
      update runledger.runs set lease_owner = null, lease_expires_at = null, updated_at = v_now,
                                recovery_attempts = v_run.recovery_attempts + 1
       where run_id = v_run.run_id;
      insert into runledger.events (run_id, kind, detail, fencing_token, at)
      values (v_run.run_id, 'lease_expired', jsonb_build_object('last_owner', v_run.lease_owner, 'cancelling', true,
                                                                'recovery_attempts', v_run.recovery_attempts + 1), v_run.fencing_token, v_now);
      perform runledger._dispatch(v_run.run_id, v_run.queue_name);
    elsif v_run.status = 'CANCELLING' then
      -- Its owner died while cancelling: complete the cancellation instead of resuming the
      -- work (a stopping run ends with its stop_record, see _finish_run). Compensations
      -- still due here were given up on: the evidence and the event say which.
      if runledger._compensations_due(v_run.run_id) then
        insert into runledger.events (run_id, kind, detail, fencing_token, at)
        values (v_run.run_id, 'compensations_abandoned',
                jsonb_build_object('recovery_attempts', v_run.recovery_attempts, 'max_recovery_attempts', v_run.max_recovery_attempts,
                                   'compensations', runledger._compensation_summary(v_run.run_id)), v_run.fencing_token, v_now);
      end if;
      perform runledger._finish_run(v_run.run_id, v_run.fencing_token, 'CANCELLED', 'CANCELLED', null, null,
        jsonb_build_object('reason', v_run.cancel_reason, 'requested_at', v_run.cancel_requested_at,
                           'completed_by', 'recovery', 'last_owner', v_run.lease_owner), null);
    else
      -- Attempts count the lease expiries since the run last made progress: an execution
      -- that committed a checkpoint under its fencing token starts the count again.
      v_attempts := case when runledger._made_progress(v_run.run_id, v_run.fencing_token) then 0 else v_run.recovery_attempts end;
      if v_attempts + 1 > v_run.max_recovery_attempts then
        -- Through _finish_run (and _finished): the event, the parent's wake-up and the
        -- admission of the next run of a limited queue, in this transaction.
        -- The last error that put it here is the expiry itself (its owner died or hung):
        -- in runs.error and in the evidence, as _release_run records a worker's error.
        v_error := jsonb_build_object('name', 'LeaseExpired', 'code', 'LEASE_EXPIRED',
          'message', format('the lease of worker %s expired at %s without a checkpoint, %s times in a row (max_recovery_attempts %s)',
                            v_run.lease_owner, v_run.lease_expires_at, v_attempts + 1, v_run.max_recovery_attempts));
        perform runledger._finish_run(v_run.run_id, v_run.fencing_token, 'DEAD_LETTER', 'MAX_RECOVERY_ATTEMPTS', null, v_error,
          jsonb_build_object(
            'recovery_attempts', v_attempts,
            'max_recovery_attempts', v_run.max_recovery_attempts,
            'last_owner', v_run.lease_owner,
            'lease_expired_at', v_run.lease_expires_at,
            'last_error', v_error),
          'runledger/1');
      else
        update runledger.runs
           set status = 'PENDING', recovery_attempts = v_attempts + 1, updated_at = v_now,
               lease_owner = null, lease_expires_at = null
         where run_id = v_run.run_id;
        insert into runledger.events (run_id, kind, detail, fencing_token, at)
        values (v_run.run_id, 'lease_expired',
                jsonb_strip_nulls(jsonb_build_object('last_owner', v_run.lease_owner, 'lease_expired_at', v_run.lease_expires_at,
                                   'recovery_attempt', v_attempts + 1,
                                   'progress_reset', case when v_attempts <> v_run.recovery_attempts then true end)),
                v_run.fencing_token, v_now);
        perform runledger._make_runnable(v_run.run_id, 0);
      end if;
    end if;
  end loop;

  -- A worker silent for two lease lengths is dead; its runs were (or are being) recovered above.
  update runledger.workers w set stopped_at = v_now
   where w.stopped_at is null and w.last_heartbeat_at < v_now - make_interval(secs => 2 * w.lease_ms / 1000.0);
  return v_count;
end;
$function$;
COMMENT ON FUNCTION runledger._recover_expired(integer) IS 'Sweeper, run by every live worker: each RUNNING run whose lease expired goes back to PENDING counting one recovery attempt and is re-dispatched, or, past max_recovery_attempts, to DEAD_LETTER with its termination record and the error LEASE_EXPIRED (runs.error, evidence.last_error) (through _finish_run: parent woken, queue slot freed). Attempts count expiries since the last progress: an expired execution that committed a checkpoint under its fencing token (_made_progress) starts the count again at 1. A CANCELLING one with compensations due is left without an owner for the next claim (counting an attempt; past max_recovery_attempts they are given up on, event compensations_abandoned); without, or given up on, it ends CANCELLED (or with its stop_record). Marks silent workers stopped. Returns how many runs it handled.';

CREATE OR REPLACE FUNCTION runledger._register_worker(p_worker_id text, p_host text, p_pid integer, p_workflows text[], p_queues text[], p_concurrency integer, p_lease_ms integer, p_migrations text[] DEFAULT '{}'::text[])
 RETURNS void
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
  insert into runledger.workers (worker_id, host, pid, workflows, queues, concurrency, lease_ms, migrations)
  values (p_worker_id, p_host, p_pid, p_workflows, p_queues, p_concurrency, p_lease_ms, coalesce(p_migrations, '{}'))
  on conflict (worker_id) do update
     set last_heartbeat_at = runledger.now(), stopped_at = null
$function$;
COMMENT ON FUNCTION runledger._register_worker(text,text,integer,text[],text[],integer,integer,text[]) IS 'A worker process announces what it serves (workflow@version, queues), the run migrations it applies (workflow@from>to), its concurrency and lease length.';

CREATE OR REPLACE FUNCTION runledger._register_workflow(p_name text, p_version text, p_queue text, p_max_recovery_attempts integer, p_limits jsonb DEFAULT '{}'::jsonb, p_manifest jsonb DEFAULT NULL::jsonb)
 RETURNS void
 LANGUAGE sql
 SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
  insert into runledger.workflows (workflow_name, workflow_version, queue_name, max_recovery_attempts, limits, manifest)
  values (p_name, p_version, p_queue, p_max_recovery_attempts, coalesce(p_limits, '{}'), p_manifest)
  on conflict (workflow_name, workflow_version) do update
     set queue_name = excluded.queue_name, max_recovery_attempts = excluded.max_recovery_attempts,
         limits = excluded.limits, manifest = coalesce(excluded.manifest, runledger.workflows.manifest),
         registered_at = runledger.now()
$function$;
COMMENT ON FUNCTION runledger._register_workflow(text,text,text,integer,jsonb,jsonb) IS 'Records a workflow (name, version) with its default queue, recovery limit, limits (deadline, max_steps, budget, no_progress) and version manifest, so start_run from SQL can resolve them (a run started from SQL records that manifest).';

CREATE OR REPLACE FUNCTION runledger._release_run(p_run_id text, p_token bigint, p_delay_ms bigint, p_reason text, p_counts_attempt boolean DEFAULT false, p_error jsonb DEFAULT NULL::jsonb)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_run   runledger.runs;
  v_now   timestamptz := runledger.now();
  v_error jsonb := coalesce(p_error, jsonb_build_object('name', 'Released', 'code', upper(p_reason),
                     'message', format('the worker gave the run back: %s', p_reason)));
begin
  -- By its key, checked after (sql/README.md, "Plans that cannot go stale").
  select * into v_run from runledger.runs where run_id = p_run_id for update;
  if not found or v_run.fencing_token is distinct from p_token or v_run.status <> 'RUNNING' then
    return false;
  end if;
  if p_counts_attempt and runledger._made_progress(p_run_id, p_token) then
    -- As in _recover_expired: the count is of failures since the run last made progress.
    v_run.recovery_attempts := 0;
  end if;
  if p_counts_attempt and v_run.recovery_attempts + 1 > v_run.max_recovery_attempts then
    -- An execution that keeps failing for infrastructure reasons must not loop forever; the
    -- dead letter says why the last one failed.
    perform runledger._finish_run(p_run_id, p_token, 'DEAD_LETTER', 'MAX_RECOVERY_ATTEMPTS', null, v_error,
      jsonb_build_object('recovery_attempts', v_run.recovery_attempts, 'max_recovery_attempts', v_run.max_recovery_attempts,
                         'last_release', p_reason, 'last_error', v_error),
      'runledger/1');
    return true;
  end if;
  update runledger.runs
     set status = 'PENDING', lease_owner = null, lease_expires_at = null, updated_at = v_now,
         recovery_attempts = v_run.recovery_attempts + case when p_counts_attempt then 1 else 0 end
   where run_id = p_run_id;
  insert into runledger.events (run_id, kind, detail, fencing_token, at)
  values (p_run_id, 'released', jsonb_strip_nulls(jsonb_build_object('reason', p_reason, 'delay_ms', p_delay_ms,
                                                                     'counts_attempt', p_counts_attempt, 'error', p_error)),
          p_token, v_now);
  perform runledger._make_runnable(p_run_id, p_delay_ms);
  return true;
end;
$function$;
COMMENT ON FUNCTION runledger._release_run(text,bigint,bigint,text,boolean,jsonb) IS 'A worker gives a run back: RUNNING -> PENDING, re-dispatched after p_delay_ms. A graceful stop does not count a recovery attempt; an infrastructure failure does (p_counts_attempt; counting again from 1 when this execution committed a checkpoint, _made_progress), and past max_recovery_attempts the run is dead-lettered instead, with p_error (the error the worker released it for; built from p_reason when null) in runs.error and evidence.last_error. The event released keeps p_error too.';

CREATE OR REPLACE FUNCTION runledger._release_session(p_session_id text)
 RETURNS text
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
declare
  v_tenant  text := runledger._session_scope();
  v_session runledger.sessions;
begin
  perform runledger._session_check_id(p_session_id);
  select * into v_session from runledger.sessions where session_id = p_session_id and tenant_id = v_tenant for update;
  if not found then
    raise exception using errcode = 'RL002', message = format('release_session: session %L not found', p_session_id);
  end if;
  if v_session.holder_run_id is null then
    return null;
  end if;
  insert into runledger.events (run_id, kind, detail)
  select r.run_id, 'session_released', jsonb_build_object('session_id', p_session_id, 'by', 'operator')
    from runledger.runs r where r.run_id = v_session.holder_run_id;
  return runledger._session_free(p_session_id, v_tenant, 'operator');
end;
$function$;
COMMENT ON FUNCTION runledger._release_session(text) IS 'The action behind runledger.release_session (which records it in audit_log): Operator repair: takes a session (of the tenant the caller''s session names) from its holder (a run stuck while holding it) and hands it to the next waiter, which is woken. Returns the new holder (null: nobody waited, or it was free). The former holder''s next append fails with RL005 (SESSION_NOT_HELD); its history records a session_released event. Unknown session: RL002.';

CREATE OR REPLACE FUNCTION runledger._resolve_operation(p_operation_id text, p_status text, p_result jsonb DEFAULT NULL::jsonb, p_resolved_by text DEFAULT NULL::text)
 RETURNS text
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
declare
  v_op  runledger.operations;
  v_run runledger.runs;
begin
  if p_status not in ('SUCCEEDED', 'FAILED') then
    raise exception using errcode = 'RL003', message = format('resolve_operation: status must be SUCCEEDED or FAILED, not %L', p_status);
  end if;
  select * into v_op from runledger.operations where operation_id = p_operation_id for update;
  if not found then
    raise exception using errcode = 'RL002', message = format('resolve_operation: operation %L not found', p_operation_id);
  end if;
  if v_op.status not in ('UNKNOWN', 'STARTED') then
    raise exception using errcode = 'RL005', message = format('resolve_operation: operation %s is %s, not UNKNOWN', p_operation_id, v_op.status);
  end if;
  -- A worker executes the run: the call may be in flight, and the worker records its outcome
  -- (over the operator's). An expired lease too: until recovery takes the run back, the
  -- worker holding it may still write. Once no worker holds it, its writes are fenced off.
  select * into v_run from runledger.runs r where r.run_id = v_op.run_id;
  if v_run.status in ('RUNNING', 'CANCELLING') and v_run.lease_owner is not null then
    raise exception using errcode = 'RL005',
      message = format('resolve_operation: operation %s (%s) is %s and its run %s is executed by worker %s (lease %s %s): '
                       'its call may still be in flight, and that worker records the outcome. Wait: a call whose outcome is '
                       'lost leaves the operation UNKNOWN and the run waiting for you (runledger.unknown_operations)%s; '
                       'or cancel the run (cancel_run)',
                       p_operation_id, v_op.name, v_op.status, v_op.run_id, v_run.lease_owner,
                       case when v_run.lease_expires_at > runledger.now() then 'until' else 'expired at' end,
                       v_run.lease_expires_at,
                       case when v_run.lease_expires_at > runledger.now() then ''
                            else ' once recovery has taken the run back from that worker' end);
  end if;
  update runledger.operations
     set status = p_status, result = case when p_status = 'SUCCEEDED' then p_result end,
         error = case when p_status = 'FAILED' then coalesce(p_result, jsonb_build_object('message', 'resolved as failed by an operator')) end,
         resolved_by = coalesce(p_resolved_by, runledger._caller()), updated_at = runledger.now(), finished_at = runledger.now()
   where operation_id = p_operation_id;
  insert into runledger.events (run_id, kind, detail)
  values (v_op.run_id, 'operation_resolved', jsonb_build_object('operation_id', p_operation_id, 'status', p_status, 'by', coalesce(p_resolved_by, runledger._caller())));
  perform runledger._wake(v_op.run_id, 'reconcile', p_operation_id);
  return p_status;
end;
$function$;
COMMENT ON FUNCTION runledger._resolve_operation(text,text,jsonb,text) IS 'The action behind runledger.resolve_operation (which records it in audit_log): Operator action: settles an UNKNOWN (or STARTED) operation as SUCCEEDED (p_result is its result) or FAILED (p_result is the error), and wakes the run waiting on it. Returns the status set. RL005 while a worker holds the operation''s run (RUNNING or CANCELLING with an owner, its lease live or expired and not yet recovered): its call may be in flight and the worker records the outcome; wait, or cancel the run.';

CREATE OR REPLACE FUNCTION runledger._retention_fork_live(p_run_id text)
 RETURNS boolean
 LANGUAGE sql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
  with recursive lineage (run_id, status) as (
    select f.run_id, f.status from runledger.runs f
     where f.version_manifest ? 'forked_from' and f.version_manifest->>'forked_from' = p_run_id
    union
    select f.run_id, f.status from lineage l
      join runledger.runs f on f.version_manifest ? 'forked_from' and f.version_manifest->>'forked_from' = l.run_id)
  select exists (select 1 from lineage l where not runledger.is_terminal(l.status))
$function$;
COMMENT ON FUNCTION runledger._retention_fork_live(text) IS 'True when a run forked from this run, or from one of its forks (at any depth), is not terminal: the fork may still reuse the lineage''s operations, so retention keeps the run.';

CREATE OR REPLACE FUNCTION runledger._retention_key_held(p_workflow text, p_finished_at timestamp with time zone)
 RETURNS boolean
 LANGUAGE sql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
  select coalesce((select k.keep is null or p_finished_at >= runledger.now() - k.keep
                     from runledger.retention k
                    where k.kind = 'idempotency' and (k.workflow_name = p_workflow or k.workflow_name is null)
                    order by k.workflow_name nulls last
                    limit 1), false)
$function$;
COMMENT ON FUNCTION runledger._retention_key_held(text,timestamp with time zone) IS 'True while an idempotency rule (the workflow''s own, else the default) holds the key of a run of this workflow that finished at that time: keep null, or not yet expired. False when no rule applies (the key lives as long as its run).';

CREATE OR REPLACE FUNCTION runledger._retry_run(p_run_id text)
 RETURNS text
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
declare
  v_run     runledger.runs;
  v_dropped jsonb;
  v_reset   jsonb;
  v_undone  jsonb;
begin
  select * into v_run from runledger.runs where run_id = p_run_id for update;
  if not found then
    raise exception using errcode = 'RL002', message = format('retry_run: run %L not found', p_run_id);
  end if;
  if v_run.status not in ('DEAD_LETTER', 'FAILED') then
    raise exception using errcode = 'RL005',
      message = format('retry_run: run %s is %s; only DEAD_LETTER and FAILED runs can be retried', p_run_id, v_run.status);
  end if;
  -- A retry replays the run's checkpoints and goes on: never from an effect a compensation
  -- undid (it would ship against a refunded charge). Doing that work again is a fork from
  -- before it, which calls the operation again.
  v_undone := runledger._undone_operations(p_run_id);
  if v_undone <> '[]'::jsonb then
    raise exception using errcode = 'RL005', message = runledger._undone_refusal('retry_run', p_run_id, v_undone);
  end if;
  -- The failed step that ended the run is run again; every successful checkpoint stays.
  delete from runledger.steps s
   where s.run_id = p_run_id and s.status = 'FAILED'
     and s.seq = (select max(seq) from runledger.steps where run_id = p_run_id)
  returning jsonb_build_object('seq', s.seq, 'name', s.name, 'error', s.error) into v_dropped;
  -- A failed operation at that step is callable again: the ledger row goes back to PLANNED
  -- (same operation_id and idempotency key, no attempt made yet); the failure it held is
  -- kept in the 'retried' event. An UNKNOWN one stays UNKNOWN (reconcile or an operator settles it).
  update runledger.operations o
     set status = 'PLANNED', attempts = 0, error = null, result = null, finished_at = null, resolved_by = null,
         updated_at = runledger.now()
    from (select * from runledger.operations
           where run_id = p_run_id and seq = (v_dropped->>'seq')::int and status = 'FAILED' for update) old
   where o.operation_id = old.operation_id
  returning jsonb_build_object('operation_id', old.operation_id, 'name', old.name, 'idempotency_key', old.idempotency_key,
                               'attempts', old.attempts, 'error', old.error, 'resolved_by', old.resolved_by) into v_reset;

  update runledger.runs
     set status = 'PENDING', error = null, output = null, finished_at = null, updated_at = runledger.now(),
         recovery_attempts = 0, termination_reason = null, termination_evidence = null,
         terminated_at = null
   where run_id = p_run_id;
  -- The old termination record is kept in the history.
  insert into runledger.events (run_id, kind, detail, fencing_token)
  values (p_run_id, 'retried', jsonb_strip_nulls(jsonb_build_object(
            'previous_status', v_run.status, 'termination_reason', v_run.termination_reason,
            'termination_evidence', v_run.termination_evidence, 'error', v_run.error,
            'dropped_failed_step', v_dropped, 'reset_operation', v_reset)), v_run.fencing_token);
  perform runledger._make_runnable(p_run_id, 0);
  return 'PENDING';
end;
$function$;
COMMENT ON FUNCTION runledger._retry_run(text) IS 'The action behind runledger.retry_run (which records it in audit_log): Operator action: a DEAD_LETTER or FAILED run goes back to PENDING with its successful checkpoints intact (the last failed step runs again; a FAILED operation at that step goes back to PLANNED, called again with the same idempotency key) and recovery attempts reset; the old termination record and the operation''s failure stay in events. Returns the new status. RL005 for a run whose compensations undid (or tried to undo) an operation it would replay (runledger._undone_operations): the message says to fork it from before the first, which calls the operation again.';

CREATE OR REPLACE FUNCTION runledger._retry_wait(p_run_id text, p_token bigint, p_seq integer, p_name text, p_kind text, p_attempt integer, p_delay_ms bigint)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_run  runledger.runs := runledger._fence(p_run_id, p_token);
  v_wake timestamptz := runledger._ms_after(runledger.now(), p_delay_ms, '_retry_wait: p_delay_ms');
begin
  -- The step position keeps a WAITING row with the attempt reached; the next attempt after
  -- the backoff reads it. The worker is freed meanwhile.
  insert into runledger.steps (run_id, seq, name, kind, status, output, attempts, started_at, finished_at, fencing_token)
  values (p_run_id, p_seq, p_name, p_kind, 'WAITING', jsonb_build_object('attempt', p_attempt, 'wake_at', v_wake), p_attempt,
          runledger.now(), runledger.now(), p_token)
  on conflict (run_id, seq) do update set output = excluded.output, attempts = excluded.attempts, fencing_token = excluded.fencing_token
   where runledger.steps.status = 'WAITING';
  update runledger.runs
     set status = 'WAITING', wait_kind = 'retry', wait_key = p_name, wake_at = least(v_wake, v_run.deadline_at),
         lease_owner = null, lease_expires_at = null, updated_at = runledger.now()
   where run_id = p_run_id;
  perform runledger._slot_freed(p_run_id);
  perform runledger._dispatch(p_run_id, v_run.queue_name,
    greatest(0, ceil(extract(epoch from least(v_wake, v_run.deadline_at) - runledger.now()) * 1000))::bigint);
end;
$function$;
COMMENT ON FUNCTION runledger._retry_wait(text,bigint,integer,text,text,integer,bigint) IS 'Fenced: a backoff too long to sleep in memory becomes a durable wait (wait_kind retry): the step keeps a WAITING row with the attempt reached and the run waits, holding no worker, until the next attempt is due.';

CREATE OR REPLACE FUNCTION runledger._run_amounts(p_budget_spent numeric, p_budget_used jsonb)
 RETURNS jsonb
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
  select coalesce(p_budget_used, '{}'::jsonb) || jsonb_build_object('units', coalesce(p_budget_spent, 0))
$function$;
COMMENT ON FUNCTION runledger._run_amounts(numeric,jsonb) IS 'A run''s spending as one object of dimensions: budget_used with units (budget_spent).';

CREATE OR REPLACE FUNCTION runledger._run_limits(p_budget numeric, p_budget_limits jsonb)
 RETURNS jsonb
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
  select coalesce(p_budget_limits, '{}'::jsonb)
         || case when p_budget is null then '{}'::jsonb else jsonb_build_object('units', p_budget) end
$function$;
COMMENT ON FUNCTION runledger._run_limits(numeric,jsonb) IS 'A run''s limits as one object of dimensions: budget_limits with units (budget); a dimension without a limit is absent.';

CREATE OR REPLACE FUNCTION runledger._run_tenant(p_run_id text)
 RETURNS text
 LANGUAGE sql
 STABLE
AS $function$
  select coalesce((select r.tenant_id from runledger.runs r where r.run_id = p_run_id), '')
$function$;
COMMENT ON FUNCTION runledger._run_tenant(text) IS 'A run''s tenant as the tenant part of a session''s key: runs.tenant_id, '''' for a run without one.';

CREATE OR REPLACE FUNCTION runledger._secure_functions()
 RETURNS void
 LANGUAGE plpgsql
AS $function$
declare
  v_fn regprocedure;
  v_pure boolean;
begin
  -- PostgreSQL lets PUBLIC execute every new function; in this schema nobody but the owner
  -- may call anything that is not granted.
  for v_fn in select p.oid::regprocedure from pg_proc p where p.pronamespace = 'runledger'::regnamespace loop
    execute format('revoke all on function %s from public', v_fn);
  end loop;
  -- A granted function runs as the owner, so it must not resolve names through the caller's
  -- search_path: pg_catalog first (no user object shadows a built-in or an operator),
  -- pg_temp last (no temporary table stands in for a runledger table). A pure function
  -- runs as its caller instead: it has nothing to protect, and only then is it inlined.
  for v_fn, v_pure in
    select p.oid::regprocedure, p.proname = any(runledger._pure_functions()) from pg_proc p
     where p.pronamespace = 'runledger'::regnamespace
       and p.proname in (select function_name from runledger.role_functions)
  loop
    if v_pure then
      execute format('alter function %s security invoker reset all', v_fn);
    else
      execute format('alter function %s security definer set search_path = pg_catalog, runledger, pg_temp', v_fn);
    end if;
  end loop;
end;
$function$;
COMMENT ON FUNCTION runledger._secure_functions() IS 'Revokes PUBLIC''s execute on every runledger function and makes each function in role_functions SECURITY DEFINER with search_path pg_catalog, runledger, pg_temp, except the pure ones (_pure_functions), which run as their caller with no settings so that they are inlined. Run by the migrations that add functions; needs the schema''s owner.';

CREATE OR REPLACE FUNCTION runledger._send_signal(p_run_id text, p_topic text, p_payload jsonb, p_signal_id text DEFAULT NULL::text)
 RETURNS boolean
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
declare
  v_run runledger.runs;
  v_id  text := coalesce(p_signal_id, runledger._new_id());
begin
  if p_topic is null or p_topic !~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]*$' or length(p_topic) > 100 then
    raise exception using errcode = 'RL003', message = format('send_signal: invalid topic %L', p_topic);
  end if;
  -- The inbox's check (signal_id of 1 to 200 characters) would raise a raw 23514.
  if length(v_id) not between 1 and 200 then
    raise exception using errcode = 'RL003',
      message = format('send_signal: signal_id must be 1 to 200 characters, not %s', length(v_id));
  end if;
  if pg_column_size(p_payload) > runledger._max_payload_bytes() then
    raise exception using errcode = 'RL004', message = format('send_signal: payload over the limit of %s bytes', runledger._max_payload_bytes());
  end if;
  -- Lock the run: a wait being recorded right now either sees this signal or is woken by it.
  select * into v_run from runledger.runs where run_id = p_run_id for update;
  if not found then
    raise exception using errcode = 'RL002', message = format('send_signal: run %L not found', p_run_id);
  end if;
  -- A retry of a signal already accepted is answered the same way whatever happened since.
  if exists (select 1 from runledger.signals s where s.signal_id = v_id) then
    return false;
  end if;
  if runledger.is_terminal(v_run.status) then
    raise exception using errcode = 'RL005', message = format('send_signal: run %s already finished (%s)', p_run_id, v_run.status);
  end if;
  insert into runledger.signals (signal_id, run_id, topic, payload) values (v_id, p_run_id, p_topic, p_payload)
  on conflict (signal_id) do nothing;
  if not found then
    return false; -- the same signal_id was accepted before: nothing changes
  end if;
  insert into runledger.events (run_id, kind, detail)
  values (p_run_id, 'signal_received', jsonb_build_object('topic', p_topic, 'signal_id', v_id));
  perform runledger._wake(p_run_id, 'signal', p_topic);
  return true;
end;
$function$;
COMMENT ON FUNCTION runledger._send_signal(text,text,jsonb,text) IS 'The action behind runledger.send_signal (which records it in audit_log): Delivers a signal to a run''s durable inbox; returns false (changing nothing) when signal_id was already accepted. Wakes the run if it waits on this topic; otherwise the signal waits for a later wait. Invalid topic or a signal_id that is not 1 to 200 characters: RL003; unknown run: RL002; finished run: RL005.';

CREATE OR REPLACE FUNCTION runledger._session_acquire(p_session_id text, p_run_id text)
 RETURNS jsonb
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_tenant  text := runledger._run_tenant(p_run_id);
  v_session runledger.sessions;
  v_status  runledger.run_status;
  v_ticket  bigint;
begin
  perform runledger._session_check_id(p_session_id);
  insert into runledger.sessions (session_id, tenant_id) values (p_session_id, v_tenant)
  on conflict (session_id, tenant_id) do nothing;
  select * into v_session from runledger.sessions where session_id = p_session_id and tenant_id = v_tenant for update;
  if v_session.holder_run_id is not null and v_session.holder_run_id <> p_run_id then
    -- A holder that ended lets go by the trigger runs_session_release; one found ended or
    -- gone anyway (a run row deleted by hand) is treated as gone.
    select r.status into v_status from runledger.runs r where r.run_id = v_session.holder_run_id;
    if v_status is null or runledger.is_terminal(v_status) then
      delete from runledger.session_waiters where session_id = p_session_id and run_id = p_run_id;
      perform runledger._session_free(p_session_id, v_tenant, 'ended');
      select * into v_session from runledger.sessions where session_id = p_session_id and tenant_id = v_tenant;
    end if;
  end if;
  if v_session.holder_run_id is null then
    -- Free: a free session has nobody queued (a hand-off gives it to the first waiter),
    -- but should someone be, they come first.
    delete from runledger.session_waiters where session_id = p_session_id and run_id = p_run_id;
    if exists (select 1 from runledger.session_waiters w where w.session_id = p_session_id and w.tenant_id = v_tenant) then
      perform runledger._session_handoff(p_session_id, v_tenant);
      select * into v_session from runledger.sessions where session_id = p_session_id and tenant_id = v_tenant;
    end if;
  end if;
  if v_session.holder_run_id is null then
    update runledger.sessions set holder_run_id = p_run_id, held_at = runledger.now(), updated_at = runledger.now()
     where session_id = p_session_id and tenant_id = v_tenant
    returning * into v_session;
  end if;
  if v_session.holder_run_id = p_run_id then
    delete from runledger.session_waiters where session_id = p_session_id and run_id = p_run_id;
    return jsonb_build_object('held', true, 'entry_count', v_session.entry_count);
  end if;
  insert into runledger.session_waiters (session_id, tenant_id, run_id) values (p_session_id, v_tenant, p_run_id)
  on conflict (session_id, run_id) do nothing;
  select w.ticket into v_ticket from runledger.session_waiters w where w.session_id = p_session_id and w.run_id = p_run_id;
  return jsonb_build_object(
    'held', false, 'holder', v_session.holder_run_id,
    'position', (select count(*) from runledger.session_waiters w
                  where w.session_id = p_session_id and w.tenant_id = v_tenant and w.ticket <= v_ticket));
end;
$function$;
COMMENT ON FUNCTION runledger._session_acquire(text,text) IS 'Inside a run''s transaction step: holds the session of that id of the run''s tenant for p_run_id if it is free (or already its own, or its holder ended) and answers {held: true, entry_count}; otherwise queues the run (once) and answers {held: false, holder, position}. Creates the session on first use (per tenant: another tenant''s session of the same id is another session). Invalid id: RL003.';

CREATE OR REPLACE FUNCTION runledger._session_append(p_session_id text, p_run_id text, p_position integer, p_entries jsonb)
 RETURNS jsonb
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_tenant  text := runledger._run_tenant(p_run_id);
  v_session runledger.sessions;
  v_count   int;
begin
  select * into v_session from runledger.sessions where session_id = p_session_id and tenant_id = v_tenant for update;
  if not found then
    raise exception using errcode = 'RL005', message = format('session %s is not held by run %s: it does not exist', p_session_id, p_run_id);
  end if;
  if v_session.holder_run_id is distinct from p_run_id then
    if v_session.holder_run_id is null and v_session.last_holder_run_id = p_run_id and v_session.release_reason = 'ended'
       and not exists (select 1 from runledger.session_waiters w where w.session_id = p_session_id and w.tenant_id = v_tenant) then
      -- The run held it when it ended and has been brought back (retry_run); nobody has held
      -- it since, so its history is still the one the run read: it takes it back.
      update runledger.sessions set holder_run_id = p_run_id, held_at = runledger.now(), updated_at = runledger.now()
       where session_id = p_session_id and tenant_id = v_tenant;
    else
      raise exception using errcode = 'RL005',
        message = format('session %s is not held by run %s (%s)', p_session_id, p_run_id,
                         coalesce('held by ' || v_session.holder_run_id, 'it is free'));
    end if;
  end if;
  if jsonb_typeof(p_entries) is distinct from 'array' or exists (
       select 1 from jsonb_array_elements(p_entries) e
        where jsonb_typeof(e) <> 'object' or not (e ? 'content')
           or coalesce(e->>'role', '') not in ('system', 'user', 'assistant', 'tool')) then
    raise exception using errcode = 'RL003',
      message = format('session %s: entries must be an array of {role: system|user|assistant|tool, content}', p_session_id);
  end if;
  insert into runledger.session_entries (session_id, tenant_id, seq, role, content, run_id, step_position, entry_index)
  select p_session_id, v_tenant, v_session.entry_count + e.ordinality::int, e.value->>'role', e.value->'content', p_run_id, p_position,
         e.ordinality::int - 1
    from jsonb_array_elements(p_entries) with ordinality e;
  get diagnostics v_count = row_count;
  update runledger.sessions set entry_count = entry_count + v_count, updated_at = runledger.now()
   where session_id = p_session_id and tenant_id = v_tenant;
  return jsonb_build_object('first_seq', v_session.entry_count + 1, 'last_seq', v_session.entry_count + v_count);
end;
$function$;
COMMENT ON FUNCTION runledger._session_append(text,text,integer,jsonb) IS 'Inside the holder''s transaction step at p_position: appends the entries ([{role, content}], numbered after the last) to the session of the run''s tenant and answers {first_seq, last_seq}. A run that does not hold the session: RL005 (a run that held it when it ended and was retried takes it back if nobody held it since and nobody waits). Bad entries: RL003.';

CREATE OR REPLACE FUNCTION runledger._session_budget_caps(p_run_id text, p_base jsonb)
 RETURNS jsonb
 LANGUAGE sql
 STABLE
AS $function$
  -- Per dimension, the smallest of the run's own limit and the caps of the budgeted sessions it holds.
  select coalesce(jsonb_object_agg(dim, lim), '{}'::jsonb)
    from (select dim, min(lim) as lim
            from (select l.key as dim, l.value::numeric as lim from jsonb_each_text(coalesce(p_base, '{}'::jsonb)) l
                  union all
                  select c.key, c.value::numeric
                    from runledger.sessions s, jsonb_each_text(s.holder_mark->'cap') c
                   where s.holder_run_id = p_run_id and s.holder_mark is not null) x
           group by dim) y
$function$;
COMMENT ON FUNCTION runledger._session_budget_caps(text,jsonb) IS 'The limits a run is held to: per dimension the smallest of p_base (its own limits) and the cap of each session with a budget that it holds.';

CREATE OR REPLACE FUNCTION runledger._session_budget_close(p_session_id text, p_tenant_id text)
 RETURNS jsonb
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
declare
  v_session runledger.sessions;
  v_run     runledger.runs;
begin
  -- The caller holds the session row. What the holder charged since its mark goes to the
  -- session, once: the mark is cleared in the same transaction.
  select * into v_session from runledger.sessions where session_id = p_session_id and tenant_id = p_tenant_id;
  if v_session.holder_mark is null then
    return null;
  end if;
  select * into v_run from runledger.runs where run_id = v_session.holder_run_id;
  update runledger.sessions
     set budget_used = case when v_run.run_id is null then budget_used
                            else runledger._add_amounts(budget_used,
                                   runledger._sub_amounts(runledger._run_amounts(v_run.budget_spent, v_run.budget_used),
                                                          v_session.holder_mark->'used')) end,
         holder_mark = null
   where session_id = p_session_id and tenant_id = p_tenant_id;
  return v_session.holder_mark->'base';
end;
$function$;
COMMENT ON FUNCTION runledger._session_budget_close(text,text) IS 'Ends the budget mark of a session''s holder (the row locked by the caller): what it charged since the mark is added to the session''s budget_used, once. Returns the holder''s own limits recorded at the mark (null: no mark) for the caller to give back.';

CREATE OR REPLACE FUNCTION runledger._session_budget_hold(p_session_id text, p_run_id text, p_budget jsonb)
 RETURNS TABLE(budget numeric, budget_spent numeric, budget_limits jsonb, budget_used jsonb)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_tenant  text := runledger._run_tenant(p_run_id);
  v_session runledger.sessions;
begin
  select * into v_session from runledger.sessions where session_id = p_session_id and tenant_id = v_tenant for update;
  if not found or v_session.holder_run_id is distinct from p_run_id then
    raise exception using errcode = 'RL005', message = format('session %s is not held by run %s', p_session_id, p_run_id);
  end if;
  if p_budget is not null then
    perform runledger._check_budget_amounts(p_budget, 'session budget');
  end if;
  if p_budget is not null and p_budget is distinct from v_session.budget_limits then
    perform runledger._session_budget_replace(p_session_id, v_tenant, p_budget);
  else
    perform runledger._session_budget_open(p_session_id, v_tenant, null);
  end if;
  return query select r.budget, r.budget_spent, r.budget_limits, r.budget_used from runledger.runs r where r.run_id = p_run_id;
end;
$function$;
COMMENT ON FUNCTION runledger._session_budget_hold(text,text,jsonb) IS 'Inside the transaction step that took the session: p_budget (an object of dimensions; null: keep the session''s) becomes the session''s budget, and the holder is held to the session''s remainder. Returns the run''s budget columns. RL005 when p_run_id does not hold the session; RL003 for a bad budget.';

CREATE OR REPLACE FUNCTION runledger._session_budget_open(p_session_id text, p_tenant_id text, p_base jsonb)
 RETURNS void
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
declare
  v_session runledger.sessions;
  v_run     runledger.runs;
  v_used    jsonb;
  v_base    jsonb;
  v_cap     jsonb;
begin
  -- The caller holds the session row; its holder takes the session's remainder as a cap.
  select * into v_session from runledger.sessions where session_id = p_session_id and tenant_id = p_tenant_id;
  if v_session.holder_run_id is null or v_session.budget_limits is null or v_session.holder_mark is not null then
    return;
  end if;
  select * into v_run from runledger.runs where run_id = v_session.holder_run_id for update;
  if not found then
    return;
  end if;
  v_used := runledger._run_amounts(v_run.budget_spent, v_run.budget_used);
  -- Its own limits: those recorded with another budgeted session it holds, else its current ones.
  v_base := coalesce(p_base,
                     (select s.holder_mark->'base' from runledger.sessions s
                       where s.holder_run_id = v_run.run_id and s.holder_mark is not null limit 1),
                     runledger._run_limits(v_run.budget, v_run.budget_limits));
  select jsonb_object_agg(l.key, coalesce((v_used->>l.key)::numeric, 0)
                                 + greatest(0, l.value::numeric - coalesce((v_session.budget_used->>l.key)::numeric, 0)))
    into v_cap
    from jsonb_each_text(v_session.budget_limits) l;
  update runledger.sessions
     set holder_mark = jsonb_build_object('used', v_used, 'cap', coalesce(v_cap, '{}'::jsonb), 'base', v_base)
   where session_id = p_session_id and tenant_id = p_tenant_id;
  perform runledger._set_run_limits(v_run.run_id, runledger._session_budget_caps(v_run.run_id, v_base));
end;
$function$;
COMMENT ON FUNCTION runledger._session_budget_open(text,text,jsonb) IS 'The holder of a session with a budget (the row locked by the caller) is marked: its counters now, the cap the session''s remainder allows, its own limits (p_base, or found); its limits become the smallest of its own and its sessions'' caps.';

CREATE OR REPLACE FUNCTION runledger._session_budget_replace(p_session_id text, p_tenant_id text, p_budget jsonb)
 RETURNS void
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
declare
  v_base   jsonb := runledger._session_budget_close(p_session_id, p_tenant_id);
  v_holder text;
begin
  -- The caller holds the session row. What the holder spent so far is counted under the old
  -- budget; it is then held to the new one's remainder (or, with none, to its own limits).
  update runledger.sessions set budget_limits = p_budget, updated_at = runledger.now()
   where session_id = p_session_id and tenant_id = p_tenant_id
  returning holder_run_id into v_holder;
  if v_holder is not null and v_base is not null then
    perform runledger._set_run_limits(v_holder, runledger._session_budget_caps(v_holder, v_base));
  end if;
  perform runledger._session_budget_open(p_session_id, p_tenant_id, v_base);
end;
$function$;
COMMENT ON FUNCTION runledger._session_budget_replace(text,text,jsonb) IS 'A session''s budget becomes p_budget (null: none); the row is locked by the caller. The holder''s mark is closed (its spending counted) and taken again against the new budget.';

CREATE OR REPLACE FUNCTION runledger._session_check_id(p_session_id text)
 RETURNS void
 LANGUAGE plpgsql
 IMMUTABLE
AS $function$
begin
  -- Unbounded class plus length(): as for a run_id (_check_run, 0002_runs.sql).
  -- At most 92 characters, so that the wake-up topic 'session:<id>' fits a topic's 100.
  if p_session_id is null or p_session_id !~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]*$' or length(p_session_id) > 92 then
    raise exception using errcode = 'RL003',
      message = format('invalid session id %L: a name of letters, digits and _ . : / - (starting with a letter or digit), at most 92 characters', p_session_id);
  end if;
end;
$function$;
COMMENT ON FUNCTION runledger._session_check_id(text) IS 'Refuses (RL003) a session id that is not a name: [A-Za-z0-9][A-Za-z0-9_.:/-]*, at most 92 characters (the wake-up topic session:<id> must fit 100).';

CREATE OR REPLACE FUNCTION runledger._session_free(p_session_id text, p_tenant_id text, p_reason text)
 RETURNS text
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
declare
  v_holder text;
  v_base   jsonb;
begin
  select holder_run_id into v_holder from runledger.sessions where session_id = p_session_id and tenant_id = p_tenant_id;
  v_base := runledger._session_budget_close(p_session_id, p_tenant_id);
  update runledger.sessions
     set last_holder_run_id = holder_run_id, holder_run_id = null, held_at = null,
         released_at = runledger.now(), release_reason = p_reason, updated_at = runledger.now()
   where session_id = p_session_id and tenant_id = p_tenant_id and holder_run_id is not null;
  -- Its own limits come back, also when it ended: a run brought back by retry_run goes on
  -- under them, not under a cap of a session it no longer holds.
  if v_base is not null then
    perform runledger._set_run_limits(v_holder, runledger._session_budget_caps(v_holder, v_base));
  end if;
  return runledger._session_handoff(p_session_id, p_tenant_id);
end;
$function$;
COMMENT ON FUNCTION runledger._session_free(text,text,text) IS 'The holder of the session (locked by the caller) lets go, for p_reason (released, ended, operator): what it charged while holding a session with a budget is added to that budget and its own limits come back; the session goes to the next waiter. Returns the new holder or null.';

CREATE OR REPLACE FUNCTION runledger._session_handoff(p_session_id text, p_tenant_id text)
 RETURNS text
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
declare
  v_next   text;
  v_status runledger.run_status;
begin
  -- The caller holds the session row, free. The first waiter whose run has not ended
  -- takes it; waiters whose run ended or vanished are dropped on the way.
  loop
    select w.run_id into v_next from runledger.session_waiters w
     where w.session_id = p_session_id and w.tenant_id = p_tenant_id order by w.ticket limit 1;
    if not found then
      return null;
    end if;
    -- The waiter's run is locked before its place is taken: a cancel or end of that run
    -- committing right now has removed its place (the trigger runs_session_release) by the
    -- time the lock is granted, and the delete then finds nothing.
    select r.status into v_status from runledger.runs r where r.run_id = v_next for update;
    delete from runledger.session_waiters w where w.session_id = p_session_id and w.run_id = v_next;
    if found and v_status is not null and not runledger.is_terminal(v_status) then
      update runledger.sessions
         set holder_run_id = v_next, held_at = runledger.now(), updated_at = runledger.now()
       where session_id = p_session_id and tenant_id = p_tenant_id;
      perform runledger._send_signal(v_next, 'session:' || p_session_id, jsonb_build_object('session_id', p_session_id));
      return v_next;
    end if;
  end loop;
end;
$function$;
COMMENT ON FUNCTION runledger._session_handoff(text,text) IS 'The session (locked by the caller, free) goes to its first waiter whose run has not ended, which is signalled on topic session:<id> (send_signal wakes it if it waits). Returns the new holder, or null when nobody waits.';

CREATE OR REPLACE FUNCTION runledger._session_leave(p_session_id text, p_run_id text)
 RETURNS jsonb
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_session runledger.sessions;
begin
  select * into v_session from runledger.sessions
   where session_id = p_session_id and tenant_id = runledger._run_tenant(p_run_id) for update;
  if found and v_session.holder_run_id = p_run_id then
    -- The hand-off came just as the wait timed out: the session is the run's.
    return jsonb_build_object('held', true, 'entry_count', v_session.entry_count);
  end if;
  delete from runledger.session_waiters where session_id = p_session_id and run_id = p_run_id;
  return jsonb_build_object('held', false, 'holder', v_session.holder_run_id);
end;
$function$;
COMMENT ON FUNCTION runledger._session_leave(text,text) IS 'A queued run gives up (its wait timed out): it leaves the queue of its tenant''s session, unless the session was handed to it meanwhile ({held: true, entry_count}).';

CREATE OR REPLACE FUNCTION runledger._session_mark_run()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
declare
  v_run_id text;
begin
  if tg_table_name = 'sessions' then
    v_run_id := new.holder_run_id;
  else
    v_run_id := new.run_id;
  end if;
  update runledger.runs set in_sessions = true where run_id = v_run_id and in_sessions is not true;
  return null;
end;
$function$;
COMMENT ON FUNCTION runledger._session_mark_run() IS 'Trigger function of sessions_mark_holder and session_waiters_mark_run: marks the run that now holds a session, or queues for one, in_sessions (so runs_session_release fires when it ends).';

CREATE OR REPLACE FUNCTION runledger._session_on_terminal()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
declare
  v_session text;
begin
  -- The trigger's WHEN clause tests only the mark (see runs_session_release below): a run
  -- marked in_sessions whose status changed to anything but an end has nothing to let go.
  if old.status is not distinct from new.status or not runledger.is_terminal(new.status) then
    return null;
  end if;
  -- Most runs that end held no session and queued for none: one query (two index probes)
  -- and nothing written. Two queries cost a second executor start per ended run.
  -- No SET clause: it runs inside the engine's functions and inherits their settings.
  if exists (select 1 from runledger.session_waiters w where w.run_id = new.run_id)
     or exists (select 1 from runledger.sessions s where s.holder_run_id = new.run_id) then
    delete from runledger.session_waiters where run_id = new.run_id;
    -- A run holds only sessions of its own tenant.
    for v_session in
      select s.session_id from runledger.sessions s where s.holder_run_id = new.run_id order by s.session_id for update
    loop
      perform runledger._session_free(v_session, coalesce(new.tenant_id, ''), 'ended');
    end loop;
  end if;
  return null;
end;
$function$;
COMMENT ON FUNCTION runledger._session_on_terminal() IS 'Trigger function of runs_session_release: a run that reached a terminal status leaves the session queues it was in and lets go of the sessions it held, each going to its next waiter.';

CREATE OR REPLACE FUNCTION runledger._session_release(p_session_id text, p_run_id text)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_tenant text := runledger._run_tenant(p_run_id);
begin
  perform 1 from runledger.sessions
   where session_id = p_session_id and tenant_id = v_tenant and holder_run_id = p_run_id for update;
  if not found then
    return false;
  end if;
  perform runledger._session_free(p_session_id, v_tenant, 'released');
  return true;
end;
$function$;
COMMENT ON FUNCTION runledger._session_release(text,text) IS 'The holder lets go of the session (session.release()); the next waiter gets it and is woken. False when p_run_id does not hold it.';

CREATE OR REPLACE FUNCTION runledger._session_scope()
 RETURNS text
 LANGUAGE sql
 STABLE
AS $function$
  select coalesce(current_setting('runledger.tenant', true), '')
$function$;
COMMENT ON FUNCTION runledger._session_scope() IS 'The tenant whose session an operator''s call (session_history, release_session, delete_session) addresses: the setting runledger.tenant of the caller''s session, '''' (runs without a tenant) when it names none. With tenant isolation on, a caller bound to a tenant finds only that tenant''s sessions (the policies).';

CREATE OR REPLACE FUNCTION runledger._session_tenant()
 RETURNS text
 LANGUAGE sql
 STABLE SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
  select t.tenant
    from (select nullif(current_setting('runledger.tenant', true), '') as tenant) t
   where not exists (select from runledger.tenant_members m join pg_roles r on r.rolname = m.role_name
                      where pg_has_role(runledger._caller(), r.oid, 'MEMBER'))
      or exists (select from runledger.tenant_members m join pg_roles r on r.rolname = m.role_name
                  where m.tenant_id = t.tenant and pg_has_role(runledger._caller(), r.oid, 'MEMBER'))
$function$;
COMMENT ON FUNCTION runledger._session_tenant() IS 'The tenant this session acts for: the setting runledger.tenant, when the caller''s roles in tenant_members allow it (or it has none there); else null, which matches no run.';

CREATE OR REPLACE FUNCTION runledger._set_queue(p_name text, p_options jsonb)
 RETURNS runledger.queues
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
declare
  v_opts jsonb := coalesce(p_options, '{}');
  v_key  text;
  v_q    runledger.queues;
begin
  if p_name is null or p_name !~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$' then
    raise exception using errcode = 'RL003', message = format('set_queue: invalid queue name %L', p_name);
  end if;
  if jsonb_typeof(v_opts) <> 'object' then
    raise exception using errcode = 'RL003', message = 'set_queue: options must be a JSON object';
  end if;
  for v_key in select jsonb_object_keys(v_opts) loop
    if v_key not in ('concurrency', 'per_key_concurrency', 'rate_limit_max', 'rate_limit_period_ms', 'paused') then
      raise exception using errcode = 'RL003', message = format('set_queue: unknown option %L', v_key);
    end if;
  end loop;
  perform runledger._check_whole_number(v_opts, 'concurrency', 1);
  perform runledger._check_whole_number(v_opts, 'per_key_concurrency', 1);
  perform runledger._check_whole_number(v_opts, 'rate_limit_max', 1);
  perform runledger._check_whole_number(v_opts, 'rate_limit_period_ms', 1);
  if v_opts ? 'paused' and jsonb_typeof(v_opts->'paused') <> 'boolean' then
    raise exception using errcode = 'RL003', message = 'set_queue: paused must be true or false';
  end if;
  insert into runledger.queues (name) values (p_name) on conflict (name) do nothing;
  -- Keys given replace the current values (null clears a limit); keys not given are kept.
  begin
    update runledger.queues q
       set concurrency = case when v_opts ? 'concurrency' then (v_opts->>'concurrency')::int else q.concurrency end,
           per_key_concurrency = case when v_opts ? 'per_key_concurrency' then (v_opts->>'per_key_concurrency')::int else q.per_key_concurrency end,
           rate_limit_max = case when v_opts ? 'rate_limit_max' then (v_opts->>'rate_limit_max')::int else q.rate_limit_max end,
           rate_limit_period_ms = case when v_opts ? 'rate_limit_period_ms' then (v_opts->>'rate_limit_period_ms')::int else q.rate_limit_period_ms end,
           paused = case when v_opts ? 'paused' then (v_opts->>'paused')::boolean else q.paused end,
           updated_at = runledger.now()
     where q.name = p_name
    returning * into v_q;
  exception when check_violation then
    raise exception using errcode = 'RL003', message = 'set_queue: rate_limit_max and rate_limit_period_ms go together';
  end;
  if runledger._queue_limited(p_name) then
    -- Runs that were dispatched freely before the queue got limits count against them now.
    perform runledger._admit(p_name);
  else
    -- Limits lifted: everything pending goes now.
    perform runledger._make_runnable(r.run_id, 0)
       from runledger.runs r where r.queue_name = p_name and r.status = 'PENDING' and not r.admitted;
  end if;
  return v_q;
end;
$function$;
COMMENT ON FUNCTION runledger._set_queue(text,jsonb) IS 'The action behind runledger.set_queue (which records it in audit_log): Creates or changes a queue. Options: concurrency, per_key_concurrency, rate_limit_max with rate_limit_period_ms, paused; a key set to null clears that limit, keys left out are kept. Admits what the new limits allow at once.';

CREATE OR REPLACE FUNCTION runledger._set_retention(p_kind text, p_keep interval, p_workflow_name text DEFAULT NULL::text)
 RETURNS void
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
begin
  if p_kind is null or p_kind not in ('runs', 'events', 'idempotency', 'signals', 'streams', 'session_entries', 'audit_log') then
    raise exception using errcode = 'RL003',
      message = format('set_retention: kind %L is not one of runs, events, idempotency, signals, streams, session_entries, audit_log', p_kind);
  end if;
  if p_keep < interval '0' then
    raise exception using errcode = 'RL003', message = 'set_retention: keep must be an interval >= 0 (or null: forever)';
  end if;
  if p_workflow_name is not null and p_kind in ('session_entries', 'audit_log') then
    raise exception using errcode = 'RL003',
      message = format('set_retention: %s is not kept per workflow (give no workflow)', p_kind);
  end if;
  -- The audit log records the operators who set this rule: they may not shorten it below
  -- the floor the schema's owner set.
  if p_kind = 'audit_log' and p_keep < runledger._audit_log_min_keep() then
    raise exception using errcode = '42501',
      message = format('set_retention: the audit log is kept at least %s (owner_settings.audit_log_min_keep); %s is shorter',
                       runledger._audit_log_min_keep(), p_keep),
      hint = 'Only the schema''s owner lowers the floor: update runledger.owner_settings set audit_log_min_keep = ''...''; (docs/retention.md).';
  end if;
  insert into runledger.retention (kind, workflow_name, keep, updated_at)
  values (p_kind, p_workflow_name, p_keep, runledger.now())
  on conflict (kind, coalesce(workflow_name, '')) do update set keep = excluded.keep, updated_at = excluded.updated_at;
end;
$function$;
COMMENT ON FUNCTION runledger._set_retention(text,interval,text) IS 'The action behind runledger.set_retention (which records it in audit_log): sets how long a kind is kept, for one workflow or (workflow null) as the default.';

CREATE OR REPLACE FUNCTION runledger._set_run_limits(p_run_id text, p_limits jsonb)
 RETURNS runledger.runs
 LANGUAGE sql
AS $function$
  update runledger.runs
     set budget = (p_limits->>'units')::numeric, budget_limits = nullif(p_limits - 'units', '{}'::jsonb)
   where run_id = p_run_id
  returning *
$function$;
COMMENT ON FUNCTION runledger._set_run_limits(text,jsonb) IS 'Writes a run''s limits from one object of dimensions (units to budget, the others to budget_limits) and returns the row.';

CREATE OR REPLACE FUNCTION runledger._set_session_budget(p_session_id text, p_budget jsonb)
 RETURNS runledger.sessions
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
declare
  v_tenant  text := runledger._session_scope();
  v_session runledger.sessions;
begin
  perform runledger._session_check_id(p_session_id);
  if p_budget is not null then
    perform runledger._check_budget_amounts(p_budget, 'set_session_budget');
  end if;
  insert into runledger.sessions (session_id, tenant_id) values (p_session_id, v_tenant)
  on conflict (session_id, tenant_id) do nothing;
  perform 1 from runledger.sessions where session_id = p_session_id and tenant_id = v_tenant for update;
  perform runledger._session_budget_replace(p_session_id, v_tenant, p_budget);
  select * into v_session from runledger.sessions where session_id = p_session_id and tenant_id = v_tenant;
  return v_session;
end;
$function$;
COMMENT ON FUNCTION runledger._set_session_budget(text,jsonb) IS 'The action behind runledger.set_session_budget (which records it in audit_log).';

CREATE OR REPLACE FUNCTION runledger._slot_freed(p_run_id text)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
declare
  v_queue text;
begin
  select queue_name into v_queue from runledger.runs where run_id = p_run_id;
  if runledger._queue_limited(v_queue) then
    perform runledger._admit(v_queue);
  end if;
end;
$function$;
COMMENT ON FUNCTION runledger._slot_freed(text) IS 'Called when a run leaves its slot (finished, waiting, cancelled): admits the next run of a queue with limits.';

CREATE OR REPLACE FUNCTION runledger._start(p_workflow text, p_input jsonb, p_options jsonb, p_worker_id text DEFAULT NULL::text, p_lease_ms integer DEFAULT NULL::integer, p_admit boolean DEFAULT true, OUT run runledger.runs, OUT inserted boolean)
 RETURNS record
 LANGUAGE plpgsql
AS $function$
declare
  v_t   runledger.runs;
  v_now timestamptz;
  v_claim boolean;
  v_inserted boolean;
begin
  if pg_column_size(p_input) > runledger._max_payload_bytes() then
    raise exception using errcode = 'RL004',
      message = format('start_run: input is %s bytes, over the limit of %s', pg_column_size(p_input), runledger._max_payload_bytes());
  end if;
  v_t := runledger._start_template(p_workflow, p_options);
  v_now := v_t.created_at;
  v_t.run_id := coalesce(p_options->>'run_id', runledger._new_id());
  v_t.input := p_input;
  -- What _claim_batch would take now: admitted, not delayed, within its deadline.
  v_claim := p_worker_id is not null and v_t.admitted and v_t.not_before is null
             and (v_t.deadline_at is null or v_t.deadline_at > v_now);
  if v_claim then
    -- As a claim leaves it: admitted false (admission's count takes RUNNING runs).
    v_t.status := 'RUNNING';
    v_t.fencing_token := 1;
    v_t.lease_owner := p_worker_id;
    v_t.lease_expires_at := v_now + make_interval(secs => p_lease_ms / 1000.0);
    v_t.started_at := v_now;
    v_t.admitted := false;
  else
    v_t.status := 'PENDING';
    v_t.fencing_token := 0;
  end if;
  v_t.recovery_attempts := 0;
  v_t.budget_spent := 0;
  -- The row, then its events: nothing is logged when ON CONFLICT kept the row out. Two
  -- plain statements cost less than one that joins the inserted row to a list of events
  -- and sorts them.
  insert into runledger.runs (
    run_id, workflow_name, workflow_version, queue_name, status, input, admitted, not_before, priority, concurrency_key,
    idempotency_key, tenant_id, parent_run_id, deadline_at, max_recovery_attempts, version_manifest, max_steps, budget,
    budget_limits, no_progress, retry_budget, policy_version, fencing_token, lease_owner, lease_expires_at, started_at,
    traceparent, created_at, updated_at)
  values (
    v_t.run_id, v_t.workflow_name, v_t.workflow_version, v_t.queue_name, v_t.status, p_input, v_t.admitted, v_t.not_before,
    v_t.priority, v_t.concurrency_key, v_t.idempotency_key, v_t.tenant_id, v_t.parent_run_id, v_t.deadline_at,
    v_t.max_recovery_attempts, v_t.version_manifest, v_t.max_steps, v_t.budget, v_t.budget_limits, v_t.no_progress, v_t.retry_budget,
    v_t.policy_version, v_t.fencing_token, v_t.lease_owner, v_t.lease_expires_at, v_t.started_at,
    v_t.traceparent, v_t.created_at, v_t.updated_at)
  on conflict do nothing;
  v_inserted := found;
  if v_inserted and v_claim then
    -- A claimed run also gets its claimed event, after the created one (rows of VALUES
    -- are inserted in their order).
    insert into runledger.events (run_id, kind, detail, fencing_token, at)
    values (v_t.run_id, 'created', jsonb_build_object('workflow', p_workflow, 'version', v_t.workflow_version, 'queue', v_t.queue_name), null, v_now),
           (v_t.run_id, 'claimed', jsonb_build_object('worker', p_worker_id), 1, v_now);
  elsif v_inserted then
    insert into runledger.events (run_id, kind, detail, at)
    values (v_t.run_id, 'created', jsonb_build_object('workflow', p_workflow, 'version', v_t.workflow_version, 'queue', v_t.queue_name), v_now);
  end if;
  if not v_inserted then
    -- Idempotent start: the same run_id or idempotency key returns the existing run.
    select * into run from runledger.runs r
     where r.run_id = v_t.run_id
        or (v_t.idempotency_key is not null and r.workflow_name = p_workflow and r.idempotency_key = v_t.idempotency_key)
     limit 1;
    if run.workflow_name is distinct from p_workflow then
      raise exception using errcode = 'RL005',
        message = format('start_run: run_id %L already belongs to workflow %L', v_t.run_id, run.workflow_name);
    end if;
    inserted := false;
    return;
  end if;
  if v_claim then
    -- Its worker runs it: nobody else is woken.
    run := v_t;
    inserted := true;
    return;
  end if;
  if not v_t.admitted then
    -- A queue with limits: admission at once, unless the caller admits at its end
    -- (p_admit false: _start_many, once per queue, as a group commit does).
    if p_admit then
      perform runledger._admit(v_t.queue_name);
    end if;
  elsif v_t.not_before is not null or coalesce((p_options->>'notify')::boolean, true) then
    -- notify false: the caller's own worker claims the run (engine.start in a process whose
    -- worker has a free slot), so no other worker is woken for it.
    perform runledger._dispatch(v_t.run_id, v_t.queue_name,
      coalesce(greatest(0, ceil(extract(epoch from v_t.not_before - v_t.created_at) * 1000))::bigint, 0));
  end if;
  run := v_t;
  inserted := true;
end;
$function$;
COMMENT ON FUNCTION runledger._start(text,jsonb,jsonb,text,integer,boolean) IS 'One run started (start_run, _start_claimed): checks, the row and its created event, then admission (unless p_admit is false: the caller admits the queue at its end) or the announcement. Given p_worker_id and p_lease_ms, a run that is runnable at once (admitted, not delayed, within its deadline) is inserted claimed for that worker, with its claimed event. Returns the row (as inserted, or the existing run of an idempotent start) and whether it was inserted.';

CREATE OR REPLACE FUNCTION runledger._start_child(p_run_id text, p_token bigint, p_seq integer, p_name text, p_workflow text, p_input jsonb, p_options jsonb)
 RETURNS text
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_parent  runledger.runs;
  v_options jsonb;
  v_child   text;
begin
  perform runledger._fence(p_run_id, p_token);
  select * into v_parent from runledger.runs where run_id = p_run_id;
  -- The child's id derives from the parent and the step position, and the child row and
  -- the checkpoint commit together: a replay can never start a second child.
  v_options := coalesce(p_options, '{}') || jsonb_build_object('run_id', p_run_id || '.' || p_seq, 'parent_run_id', p_run_id);
  if v_parent.deadline_at is not null and not (v_options ? 'deadline') then
    v_options := v_options || jsonb_build_object('deadline', v_parent.deadline_at);
  end if;
  v_child := runledger.start_run(p_workflow, p_input, v_options);
  insert into runledger.steps (run_id, seq, name, kind, status, output, started_at, fencing_token)
  values (p_run_id, p_seq, p_name, 'child_start', 'SUCCEEDED', jsonb_build_object('runId', v_child), runledger.now(), p_token);
  return v_child;
end;
$function$;
COMMENT ON FUNCTION runledger._start_child(text,bigint,integer,text,text,jsonb,jsonb) IS 'Starts a child run (id = parent id || ''.'' || seq, parent_run_id set, parent''s deadline inherited) and checkpoints its id, in one transaction.';

CREATE OR REPLACE FUNCTION runledger._start_claimed(p_workflow text, p_input jsonb, p_options jsonb, p_worker_id text, p_lease_ms integer, p_admit boolean DEFAULT true)
 RETURNS TABLE(run_id text, claimed boolean, workflow_name text, workflow_version text, input jsonb, fencing_token bigint, recovery_attempts integer, max_steps integer, budget numeric, budget_spent numeric, budget_limits jsonb, budget_used jsonb, traceparent text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_run      runledger.runs;
  v_started  record;
  v_claimed  boolean;
  v_now      timestamptz;
begin
  if p_worker_id is null or p_lease_ms is null or p_lease_ms < 1 then
    raise exception using errcode = 'RL003', message = '_start_claimed: a worker id and a lease of at least 1 ms are required';
  end if;
  -- A new run that is runnable at once is inserted already claimed (runledger._start).
  v_started := runledger._start(p_workflow, p_input, coalesce(p_options, '{}') || '{"notify": false}', p_worker_id, p_lease_ms, p_admit);
  v_run := v_started.run;
  v_claimed := v_started.inserted and v_run.status = 'RUNNING';
  if not v_claimed then
    -- A run already there (an idempotent start), or one its queue's admission just let in:
    -- claimed here only if it was never claimed and is runnable now, as _claim_batch would
    -- claim it, and only under the run id the start asked for: the worker knows a start in
    -- flight by that id, and would otherwise take back (and run again) a run leased to it
    -- before the start's answer arrives. Found by its key and checked after (sql/README.md,
    -- "Plans that cannot go stale").
    v_now := runledger.now();
    select * into v_run from runledger.runs r where r.run_id = v_run.run_id for update;
    v_claimed := v_run.run_id = coalesce(p_options->>'run_id', v_run.run_id)
       and v_run.status = 'PENDING' and v_run.admitted and v_run.fencing_token = 0
       -- A fork (its lineage_id set) is left to the claims, which hand the worker its lineage.
       and v_run.lineage_id is null
       and v_run.workflow_version = coalesce(p_options->>'version', v_run.workflow_version)
       and (v_run.not_before is null or v_run.not_before <= v_now)
       and (v_run.deadline_at is null or v_run.deadline_at > v_now);
    if v_claimed then
      update runledger.runs r
         set status = 'RUNNING', fencing_token = 1, lease_owner = p_worker_id,
             lease_expires_at = v_now + make_interval(secs => p_lease_ms / 1000.0), admitted = false,
             started_at = coalesce(r.started_at, v_now), updated_at = v_now
       where r.run_id = v_run.run_id
      returning r.* into v_run;
      insert into runledger.events (run_id, kind, detail, fencing_token, at)
      values (v_run.run_id, 'claimed', jsonb_build_object('worker', p_worker_id), v_run.fencing_token, v_now);
    elsif v_run.status = 'PENDING' and v_run.admitted then
      -- Not claimed here: announced as start_run announces, so a worker of the queue takes it.
      perform runledger._dispatch(null, v_run.queue_name);
    end if;
  end if;
  if v_claimed then
    return query select v_run.run_id, true, v_run.workflow_name, v_run.workflow_version, v_run.input, v_run.fencing_token,
                        v_run.recovery_attempts, v_run.max_steps, v_run.budget, v_run.budget_spent, v_run.budget_limits, v_run.budget_used,
                        v_run.traceparent;
  else
    return query select v_run.run_id, false, null::text, null::text, null::jsonb, null::bigint, null::int, null::int,
                        null::numeric, null::numeric, null::jsonb, null::jsonb, null::text;
  end if;
end;
$function$;
COMMENT ON FUNCTION runledger._start_claimed(text,jsonb,jsonb,text,integer,boolean) IS 'engine.start for a run its own process''s worker takes: the run is started as start_run starts it (without NOTIFY) and claimed for p_worker_id with a lease of p_lease_ms in the same transaction, as _claim_batch would claim it: a new run that is runnable at once is inserted claimed (runledger._start), an existing never-claimed runnable one (an idempotent start, or one its queue''s admission just let in) is claimed by an update. Returns one row: claimed true with the claimed run''s fields, or claimed false (a run already claimed or of another version, a delayed start, a run admission held back, a deadline already past), in which case the run is announced as start_run announces it. p_admit false leaves the admission of a queue with limits to the caller (_start_many).';

CREATE OR REPLACE FUNCTION runledger._start_debounced(p_workflow text, p_input jsonb, p_options jsonb)
 RETURNS text
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
declare
  v_debounce jsonb := p_options->'debounce';
  v_key      text;
  v_ms       numeric;
  v_run      runledger.runs;
  v_t        runledger.runs;
  v_not_before timestamptz;
  v_max_wait numeric;
begin
  if jsonb_typeof(v_debounce) is distinct from 'object' or jsonb_typeof(v_debounce->'key') is distinct from 'string'
     or jsonb_typeof(v_debounce->'delay_ms') is distinct from 'number'
     or (v_debounce ? 'max_wait_ms' and jsonb_typeof(v_debounce->'max_wait_ms') is distinct from 'number')
     or (v_debounce - 'key' - 'delay_ms' - 'max_wait_ms') <> '{}' then
    raise exception using errcode = 'RL003',
      message = format('start_run(%s): debounce must be {"key": text, "delay_ms": number, "max_wait_ms": number (optional)}, not %s', p_workflow, v_debounce);
  end if;
  v_key := v_debounce->>'key';
  v_ms := (v_debounce->>'delay_ms')::numeric;
  if length(v_key) not between 1 and 200 then
    raise exception using errcode = 'RL003', message = format('start_run(%s): the debounce key must be 1 to 200 characters', p_workflow);
  end if;
  if p_options ?| array['run_at', 'run_in_ms', 'run_id', 'idempotency_key'] then
    raise exception using errcode = 'RL003',
      message = format('start_run(%s): debounce decides the run''s id and start time: it does not go with run_at, run_in_ms, run_id or idempotency_key', p_workflow);
  end if;
  -- The run a plain start would make (its options checked, its tenant decided): a key is the
  -- tenant's own, and a start never changes another tenant's run.
  v_t := runledger._start_template(p_workflow, p_options - 'debounce');
  -- Checks the delay (0 to 2^53 - 1 ms) before anything is written.
  v_not_before := runledger._ms_after(runledger.now(), v_ms, format('start_run(%s): debounce delay_ms', p_workflow));
  if v_debounce ? 'max_wait_ms' then
    v_max_wait := (v_debounce->>'max_wait_ms')::numeric;
    perform runledger._ms_after(runledger.now(), v_max_wait, format('start_run(%s): debounce max_wait_ms', p_workflow));
    if v_max_wait < v_ms then
      raise exception using errcode = 'RL003',
        message = format('start_run(%s): debounce max_wait_ms (%s) is shorter than delay_ms (%s)', p_workflow, v_max_wait, v_ms);
    end if;
  end if;
  -- Starts of one key take turns: the second finds the first's run.
  perform pg_advisory_xact_lock(hashtextextended(format('runledger.debounce:%s:%s:%s', p_workflow, v_t.tenant_id, v_key), 0));
  select * into v_run from runledger.runs r
   where r.workflow_name = p_workflow and r.debounce_key = v_key and r.tenant_id is not distinct from v_t.tenant_id
     and r.status = 'PENDING' and r.started_at is null
   for update;
  if found then
    -- A burst that never pauses for delay_ms still starts its run: at most max_wait_ms after
    -- the burst's first start (the run's creation).
    if v_max_wait is not null then
      v_not_before := least(v_not_before, runledger._ms_after(v_run.created_at, v_max_wait, 'debounce max_wait_ms'));
    end if;
    if pg_column_size(p_input) > runledger._max_payload_bytes() then
      raise exception using errcode = 'RL004',
        message = format('start_run: input is %s bytes, over the limit of %s', pg_column_size(p_input), runledger._max_payload_bytes());
    end if;
    update runledger.runs set input = p_input, not_before = v_not_before, updated_at = runledger.now()
     where run_id = v_run.run_id;
    insert into runledger.events (run_id, kind, detail)
    values (v_run.run_id, 'debounced', jsonb_build_object('key', v_key, 'not_before', v_not_before));
    perform runledger._dispatch(v_run.run_id, v_run.queue_name,
      greatest(0, ceil(extract(epoch from v_not_before - runledger.now()) * 1000))::bigint);
    return v_run.run_id;
  end if;
  v_run := (runledger._start(p_workflow, p_input, (p_options - 'debounce') || jsonb_build_object('run_in_ms', ceil(v_ms)::bigint))).run;
  update runledger.runs set debounce_key = v_key where run_id = v_run.run_id;
  return v_run.run_id;
end;
$function$;
COMMENT ON FUNCTION runledger._start_debounced(text,jsonb,jsonb) IS 'start_run with the option debounce {key, delay_ms, max_wait_ms}: the run of this workflow, key and tenant that has not started yet (PENDING, never claimed) gets the new input and starts delay_ms from now instead, but no later than max_wait_ms after it was created when given (event debounced), and its id is returned; else a new run, delayed by delay_ms, carrying the key. Starts of one key are serialised by an advisory lock. RL003 for a malformed debounce (max_wait_ms below delay_ms included), or with run_at, run_in_ms, run_id or idempotency_key.';

CREATE OR REPLACE FUNCTION runledger._start_many(p_items jsonb)
 RETURNS TABLE(item integer, run_id text, claimed boolean, workflow_name text, workflow_version text, input jsonb, fencing_token bigint, recovery_attempts integer, max_steps integer, budget numeric, budget_spent numeric, budget_limits jsonb, budget_used jsonb, traceparent text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_item    jsonb;
  v_index   int := 0;
  v_claim   record;
  v_started record;
  v_unclaimed text[] := '{}';
  v_queues    text[] := '{}';
begin
  if jsonb_typeof(p_items) is distinct from 'array' then
    raise exception using errcode = 'RL003',
      message = format('_start_many: items must be a JSON array, not %s', coalesce(jsonb_typeof(p_items), 'null'));
  end if;
  -- No subtransaction per item: an error undoes the whole statement, and the caller sends
  -- each of its items again alone, so every start gets its own answer. Errors are rare
  -- (the engine checks the inputs first); a subtransaction per item would cost every batch.
  -- Queues with limits admit once each at the end, in name order (_admit_queues), as a
  -- group commit does: a batch that took one queue's row lock per item, in its items'
  -- order, could wait on a group commit that holds another's.
  for v_item in select value from jsonb_array_elements(p_items) loop
    if jsonb_typeof(v_item) <> 'object'
       or (v_item ? 'worker_id' and (jsonb_typeof(v_item->'lease_ms') is distinct from 'number' or v_item->>'lease_ms' !~ '^\d{1,9}$')) then
      raise exception using errcode = 'RL003',
        message = format('_start_many: item %s must be an object {workflow, input, options[, worker_id, lease_ms (a whole number)]}, not %s',
                         v_index, left(v_item::text, 200));
    end if;
    if v_item ? 'worker_id' then
      select * into v_claim
        from runledger._start_claimed(v_item->>'workflow', v_item->'input', v_item->'options', v_item->>'worker_id',
                                      (v_item->>'lease_ms')::int, p_admit => false);
      if not v_claim.claimed then
        v_unclaimed := v_unclaimed || v_claim.run_id;
      end if;
      -- The row by assignments (PL/pgSQL's simple expressions), not a query per item.
      item := v_index;
      run_id := v_claim.run_id;
      claimed := v_claim.claimed;
      workflow_name := v_claim.workflow_name;
      workflow_version := v_claim.workflow_version;
      input := v_claim.input;
      fencing_token := v_claim.fencing_token;
      recovery_attempts := v_claim.recovery_attempts;
      max_steps := v_claim.max_steps;
      budget := v_claim.budget;
      budget_spent := v_claim.budget_spent;
      budget_limits := v_claim.budget_limits;
      budget_used := v_claim.budget_used;
      traceparent := v_claim.traceparent;
      return next;
    else
      -- As start_run (its announcement included: identical notifications of one transaction are sent once).
      select * into v_started from runledger._start(v_item->>'workflow', v_item->'input', v_item->'options', p_admit => false);
      if v_started.inserted and not (v_started.run).admitted then
        v_queues := v_queues || (v_started.run).queue_name;
      end if;
      item := v_index;
      run_id := (v_started.run).run_id;
      claimed := false;
      workflow_name := null;
      workflow_version := null;
      input := null;
      fencing_token := null;
      recovery_attempts := null;
      max_steps := null;
      budget := null;
      budget_spent := null;
      budget_limits := null;
      budget_used := null;
      traceparent := null;
      return next;
    end if;
    v_index := v_index + 1;
  end loop;
  -- The queues of the runs started here that wait for admission: a new run not admitted, and
  -- the queue of a run its worker could not claim (those with limits admit). Found by run_id
  -- alone: a status in the condition would prove the predicate of runs_admission_key, and a
  -- plan cached while the table was empty walks it whole (test/plans.slow.test.ts).
  if cardinality(v_unclaimed) > 0 then
    v_queues := v_queues || array(select r.queue_name from runledger.runs r where r.run_id = any(v_unclaimed));
  end if;
  perform runledger._admit_queues(v_queues);
end;
$function$;
COMMENT ON FUNCTION runledger._start_many(jsonb) IS 'Several engine.start calls of one process in one transaction, one per element of p_items ({workflow, input, options, worker_id, lease_ms}), in order: with worker_id, runledger._start_claimed (the run claimed for that worker of the calling process when it can be); without, the start start_run makes. Queues with limits admit once each at the end, in name order (so a run of such a queue is not claimed at its start here; admission announces it). One row per item, numbered from 0, with _start_claimed''s columns (claimed false and nulls for a start without a worker). An error in any item undoes them all (the engine then starts each alone).';

CREATE OR REPLACE FUNCTION runledger._start_template(p_workflow text, p_options jsonb, p_caller text DEFAULT 'start_run'::text)
 RETURNS runledger.runs
 LANGUAGE plpgsql
AS $function$
declare
  v_now      timestamptz := runledger.now();
  v_opts     jsonb := coalesce(p_options, '{}');
  v_version  text := v_opts->>'version';
  v_run_id   text := v_opts->>'run_id';
  v_wf       runledger.workflows;
  v_queue    text;
  v_deadline timestamptz;
  v_not_before timestamptz;
  v_t        runledger.runs;
  -- Every option start_run knows (start_runs' per-input arrays are taken out before this).
  v_known    text[] := array['run_at', 'run_in_ms', 'run_id', 'idempotency_key', 'queue', 'priority', 'concurrency_key',
                             'version', 'max_recovery_attempts', 'deadline', 'max_steps', 'budget', 'no_progress',
                             'retry_budget', 'tenant_id', 'traceparent', 'notify', 'version_manifest', 'parent_run_id'];
begin
  if p_workflow is null then
    raise exception using errcode = 'RL003', message = p_caller || ': workflow name is required';
  end if;
  if jsonb_typeof(v_opts) <> 'object' then
    raise exception using errcode = 'RL003', message = p_caller || ': options must be a JSON object';
  end if;
  -- An option it does not know is refused, not ignored: a misspelt limit would be dropped.
  if v_opts - v_known <> '{}'::jsonb then
    if p_caller = 'start_runs' then
      v_known := array_remove(array_remove(v_known, 'run_id'), 'idempotency_key')
                 || array['run_ids', 'idempotency_keys', 'concurrency_keys'];
    end if;
    raise exception using errcode = 'RL003',
      message = format('%s: unknown option %s (the options are %s)', p_caller,
                       (select string_agg(quote_literal(k), ', ' order by k) from jsonb_object_keys(v_opts - v_known) k),
                       array_to_string(v_known, ', '));
  end if;

  -- A named version (engine.start names its own) is one primary-key lookup; without one,
  -- the version registered last.
  if v_version is not null then
    select * into v_wf from runledger.workflows w where w.workflow_name = p_workflow and w.workflow_version = v_version;
  else
    select * into v_wf from runledger.workflows w where w.workflow_name = p_workflow order by w.registered_at desc limit 1;
  end if;
  if not found then
    raise exception using errcode = 'RL006',
      message = format('%s: workflow %L%s is not registered (start a worker or engine that defines it)', p_caller,
                       p_workflow, coalesce(' version ' || quote_literal(v_version), ''));
  end if;

  v_queue := coalesce(v_opts->>'queue', v_wf.queue_name);
  if v_queue !~ '^[A-Za-z0-9][A-Za-z0-9_.-]*$' or length(v_queue) > 40 then
    raise exception using errcode = 'RL003', message = format('%s: invalid queue name %L', p_caller, v_queue);
  end if;
  if v_run_id !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]*$' or length(v_run_id) > 200 then
    raise exception using errcode = 'RL003', message = format('%s: invalid run_id %L', p_caller, v_run_id);
  end if;
  -- Per-run limits override the workflow's (registered) defaults.
  v_opts := coalesce(v_wf.limits, '{}') || v_opts;
  if v_opts ? 'notify' and jsonb_typeof(v_opts->'notify') <> 'boolean' then
    raise exception using errcode = 'RL003', message = format('%s: notify must be true or false, not %s', p_caller, v_opts->'notify');
  end if;
  if v_opts ? 'priority' and (jsonb_typeof(v_opts->'priority') <> 'number' or (v_opts->>'priority') !~ '^-?\d{1,9}$') then
    raise exception using errcode = 'RL003', message = format('%s: priority must be a whole number, not %s', p_caller, v_opts->'priority');
  end if;
  if v_opts ? 'max_recovery_attempts'
     and (jsonb_typeof(v_opts->'max_recovery_attempts') <> 'number' or (v_opts->>'max_recovery_attempts') !~ '^\d{1,9}$') then
    raise exception using errcode = 'RL003',
      message = format('%s: max_recovery_attempts must be a whole number >= 0, not %s', p_caller, v_opts->'max_recovery_attempts');
  end if;
  -- Most starts give none of these options (engine.start gives version, queue,
  -- max_recovery_attempts, version_manifest, run_id and notify): one test skips their checks.
  if v_opts ?| array['deadline', 'max_steps', 'no_progress', 'retry_budget', 'budget', 'tenant_id', 'traceparent', 'run_at', 'run_in_ms'] then
    if v_opts ? 'deadline' and jsonb_typeof(v_opts->'deadline') <> 'null' then
      -- A date-time ('2030-01-31T12:00Z') is a point in time; anything else ('2 days', '36h') a lifetime.
      if v_opts->>'deadline' ~ '^\d{4}-\d{2}-\d{2}' then
        v_deadline := runledger._instant(v_opts->>'deadline', p_caller || ': deadline');
      else
        begin
          v_deadline := v_now + (v_opts->>'deadline')::interval;
        exception when others then
          raise exception using errcode = 'RL003',
            message = format('%s: deadline %L is neither an interval nor a timestamp (within the times PostgreSQL holds)',
                             p_caller, v_opts->>'deadline');
        end;
        -- PostgreSQL 17 reads 'infinity' as an interval.
        if not isfinite(v_deadline) then
          raise exception using errcode = 'RL003', message = format('%s: deadline %L is not finite', p_caller, v_opts->>'deadline');
        end if;
      end if;
    end if;
    perform runledger._check_whole_number(v_opts, 'max_steps', 1);
    perform runledger._check_whole_number(v_opts, 'no_progress', 2);
    perform runledger._check_whole_number(v_opts, 'retry_budget', 0);
    perform runledger._check_budget_option(v_opts->'budget', p_caller);
    if v_opts ? 'tenant_id' and (jsonb_typeof(v_opts->'tenant_id') <> 'string' or v_opts->>'tenant_id' !~ '^[A-Za-z0-9][A-Za-z0-9_.:@-]*$'
                                 or length(v_opts->>'tenant_id') > 200) then
      raise exception using errcode = 'RL003', message = format('%s: invalid tenant_id %s', p_caller, v_opts->'tenant_id');
    end if;
    if v_opts ? 'traceparent' and jsonb_typeof(v_opts->'traceparent') <> 'null'
       and (jsonb_typeof(v_opts->'traceparent') <> 'string' or not runledger._is_traceparent(v_opts->>'traceparent')) then
      raise exception using errcode = 'RL003',
        message = format('%s: traceparent must be a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>, ids not all zeros), not %s',
                         p_caller, v_opts->'traceparent');
    end if;
    if v_opts ? 'run_at' and v_opts ? 'run_in_ms' then
      raise exception using errcode = 'RL003', message = p_caller || ': give run_at or run_in_ms, not both';
    end if;
    if v_opts ? 'run_at' then
      -- A finite timestamp: 'infinity' would never start, '-infinity' would sort first forever.
      v_not_before := runledger._instant(v_opts->>'run_at', p_caller || ': run_at');
    end if;
    if v_opts ? 'run_in_ms' then
      -- A delay, counted on the database clock from now: a caller's clock does not matter.
      -- An int8 of milliseconds, up to 2^53 - 1 (_ms_after).
      if jsonb_typeof(v_opts->'run_in_ms') <> 'number' or (v_opts->>'run_in_ms') !~ '^\d{1,16}$' then
        raise exception using errcode = 'RL003',
          message = format('%s: run_in_ms must be a whole number of milliseconds >= 0, not %s', p_caller, v_opts->'run_in_ms');
      end if;
      v_not_before := runledger._ms_after(v_now, (v_opts->>'run_in_ms')::numeric, p_caller || ': run_in_ms');
    end if;
  end if;
  v_t.workflow_name := v_wf.workflow_name;
  v_t.workflow_version := v_wf.workflow_version;
  v_t.queue_name := v_queue;
  -- The rule of _queue_limited, written out (a call per start costs more than the rule).
  v_t.admitted := not exists (select 1 from runledger.queues q
                               where q.name = v_queue
                                 and (q.concurrency is not null or q.per_key_concurrency is not null
                                      or q.rate_limit_max is not null or q.paused));
  v_t.not_before := v_not_before;
  v_t.priority := coalesce((v_opts->>'priority')::int, 0);
  v_t.concurrency_key := v_opts->>'concurrency_key';
  v_t.idempotency_key := v_opts->>'idempotency_key';
  v_t.parent_run_id := v_opts->>'parent_run_id';
  -- A child belongs to its parent's tenant; otherwise the option, else the session's tenant.
  if v_t.parent_run_id is not null then
    v_t.tenant_id := (select p.tenant_id from runledger.runs p where p.run_id = v_t.parent_run_id);
  end if;
  v_t.tenant_id := coalesce(v_t.tenant_id, v_opts->>'tenant_id', nullif(current_setting('runledger.tenant', true), ''));
  v_t.deadline_at := v_deadline;
  v_t.traceparent := v_opts->>'traceparent';
  v_t.max_recovery_attempts := coalesce((v_opts->>'max_recovery_attempts')::int, v_wf.max_recovery_attempts);
  -- A run started from SQL records the manifest its version's engines registered.
  v_t.version_manifest := coalesce(v_opts->'version_manifest', v_wf.manifest || jsonb_build_object('started_from', 'sql'),
                                   jsonb_build_object('started_from', 'sql'));
  v_t.max_steps := (v_opts->>'max_steps')::int;
  -- A number is a budget of units; an object names its dimensions (units stays in budget).
  if jsonb_typeof(v_opts->'budget') = 'object' then
    v_t.budget := (v_opts->'budget'->>'units')::numeric;
    v_t.budget_limits := nullif((v_opts->'budget') - 'units', '{}'::jsonb);
  else
    v_t.budget := (v_opts->>'budget')::numeric;
  end if;
  v_t.no_progress := (v_opts->>'no_progress')::int;
  v_t.retry_budget := (v_opts->>'retry_budget')::int;
  -- The policy a run is held to, named by what it contains: kept in its termination record.
  -- Most runs have no limit but max_recovery_attempts: their text is written out as jsonb
  -- prints it (keys by length), far cheaper than building the jsonb object and printing it.
  -- test/sql/start-run.test.ts checks that both give the same name.
  if v_deadline is null and v_opts->'max_steps' is null and v_opts->'budget' is null and v_opts->'no_progress' is null
     and (v_opts->'max_recovery_attempts' is null or jsonb_typeof(v_opts->'max_recovery_attempts') = 'number') then
    v_t.policy_version := 'limits:' || left(md5(
        '{"budget": null, "deadline": null, "max_steps": null, "no_progress": null, "max_recovery_attempts": '
        || coalesce(v_opts->>'max_recovery_attempts', v_wf.max_recovery_attempts::text) || '}'), 12);
  else
    v_t.policy_version := 'limits:' || left(md5(jsonb_build_object(
        'deadline', v_deadline, 'max_steps', v_opts->'max_steps', 'budget', v_opts->'budget',
        'no_progress', v_opts->'no_progress', 'max_recovery_attempts', coalesce(v_opts->'max_recovery_attempts', to_jsonb(v_wf.max_recovery_attempts)))::text), 12);
  end if;
  v_t.created_at := v_now;
  v_t.updated_at := v_now;
  return v_t;
end;
$function$;
COMMENT ON FUNCTION runledger._start_template(text,jsonb,text) IS 'The checks and the resolution start_run and start_runs share: validates the options (RL003), resolves the registered workflow version (RL006), merges its limits, and returns the runs row a new run starts from (no run_id or input), with admitted set by whether its queue has limits.';

CREATE OR REPLACE FUNCTION runledger._started_at(p_now timestamp with time zone, p_started_ms_ago bigint)
 RETURNS timestamp with time zone
 LANGUAGE sql
 STABLE PARALLEL SAFE
AS $function$
  select p_now - make_interval(secs => greatest(coalesce(p_started_ms_ago, 0), 0) / 1000.0)
$function$;
COMMENT ON FUNCTION runledger._started_at(timestamp with time zone,bigint) IS 'A step''s start on the database clock: p_now minus p_started_ms_ago milliseconds (the elapsed time the worker measured; null or negative is taken as 0).';

CREATE OR REPLACE FUNCTION runledger._stop_for_compensations(p_run runledger.runs, p_status runledger.run_status, p_reason text, p_evidence jsonb, p_error jsonb, p_keep_owner boolean)
 RETURNS void
 LANGUAGE plpgsql
AS $function$
declare
  v_now timestamptz := runledger.now();
begin
  update runledger.runs
     set status = 'CANCELLING', updated_at = v_now,
         stop_record = jsonb_strip_nulls(jsonb_build_object('status', p_status, 'reason', p_reason,
                                                            'evidence', p_evidence, 'error', p_error,
                                                            'stopped_at', v_now, 'was', p_run.status)),
         cancel_requested_at = v_now, cancel_reason = null,
         -- From here recovery counts the attempts at compensating (see _recover_expired).
         recovery_attempts = 0,
         finished_at = null, terminated_at = null, termination_reason = null, termination_evidence = null,
         wait_kind = null, wait_key = null, wake_at = null, admitted = false,
         lease_owner = case when p_keep_owner then lease_owner end,
         lease_expires_at = case when p_keep_owner then lease_expires_at end
   where run_id = p_run.run_id;
  insert into runledger.events (run_id, kind, detail, fencing_token, at)
  values (p_run.run_id, 'compensations_due',
          jsonb_strip_nulls(jsonb_build_object('status', p_status, 'reason', p_reason, 'was', p_run.status,
                                               'owner', case when p_keep_owner then p_run.lease_owner end)),
          p_run.fencing_token, v_now);
  if not runledger.is_terminal(p_run.status) then
    perform runledger._cancel_children(p_run.run_id, format('parent %s ended %s', p_run.run_id, p_reason));
  end if;
  if not p_keep_owner then
    perform runledger._dispatch(p_run.run_id, p_run.queue_name);
  end if;
end;
$function$;
COMMENT ON FUNCTION runledger._stop_for_compensations(runledger.runs,runledger.run_status,text,jsonb,jsonb,boolean) IS 'A run with compensations due stops as CANCELLING with its final record (status, reason, evidence, error) in stop_record: kept by its owner (p_keep_owner, the owner runs them), or without an owner and dispatched (a worker claims it). _finish_run ends it with that record.';

CREATE OR REPLACE FUNCTION runledger._stop_unowned(p_run_id text, p_status runledger.run_status, p_reason text, p_evidence jsonb)
 RETURNS boolean
 LANGUAGE plpgsql
AS $function$
declare
  v_now timestamptz := runledger.now();
  v_run runledger.runs;
begin
  if p_status = 'TERMINATED' and runledger._compensations_due(p_run_id) then
    -- A policy stop of a run that did things to undo: a worker claims it (CANCELLING,
    -- without an owner) to run its compensations, then it ends with this record.
    select * into v_run from runledger.runs where run_id = p_run_id and status in ('PENDING', 'WAITING') for update;
    if not found then
      return false;
    end if;
    perform runledger._stop_for_compensations(v_run, p_status, p_reason, p_evidence, null, false);
    return true;
  end if;
  update runledger.runs
     set status = p_status, finished_at = v_now, updated_at = v_now, terminated_at = v_now,
         termination_reason = p_reason, termination_evidence = p_evidence,
         wait_kind = null, wait_key = null, wake_at = null
   where run_id = p_run_id and status in ('PENDING', 'WAITING');
  if not found then
    return false;
  end if;
  -- A pending approval is left undecided; the approval inbox lists only waiting runs.
  perform runledger._slot_freed(p_run_id);
  insert into runledger.events (run_id, kind, detail, at)
  values (p_run_id, case p_status when 'CANCELLED' then 'cancelled' else lower(p_reason) end,
          jsonb_build_object('status', p_status, 'reason', p_reason, 'evidence', p_evidence), v_now);
  perform pg_notify('runledger_finished', p_run_id);
  perform runledger._cancel_children(p_run_id, format('parent %s ended %s', p_run_id, p_reason));
  perform runledger._wake_parent(p_run_id);
  return true;
end;
$function$;
COMMENT ON FUNCTION runledger._stop_unowned(text,runledger.run_status,text,jsonb) IS 'Ends a run that holds no worker (PENDING or WAITING) with a termination record, so no worker claims it again; cancels its children, wakes its parent. A TERMINATED stop of a run with compensations due makes it CANCELLING without an owner instead (_stop_for_compensations): a worker claims it, runs them, and it ends with that record.';

CREATE OR REPLACE FUNCTION runledger._stop_worker(p_worker_id text)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_now   timestamptz := runledger.now();
  v_run   record;
  v_count int := 0;
begin
  for v_run in
    select r.run_id, r.fencing_token, r.status, r.queue_name from runledger.runs r
     where r.lease_owner = p_worker_id and r.status in ('RUNNING', 'CANCELLING')
     order by r.run_id
     for update
  loop
    if v_run.status = 'RUNNING' then
      if runledger._release_run(v_run.run_id, v_run.fencing_token, 0, 'worker_stopped', false) then
        v_count := v_count + 1;
      end if;
    else
      -- Stopped while cancelling (a compensation still running): still CANCELLING, without
      -- an owner, for the next claim to finish the cancel at once, as _recover_expired does
      -- after a lease expiry, but without counting a recovery attempt (nothing failed).
      update runledger.runs set lease_owner = null, lease_expires_at = null, updated_at = v_now
       where run_id = v_run.run_id;
      insert into runledger.events (run_id, kind, detail, fencing_token, at)
      values (v_run.run_id, 'released', jsonb_build_object('reason', 'worker_stopped', 'delay_ms', 0, 'counts_attempt', false,
                                                           'cancelling', true), v_run.fencing_token, v_now);
      perform runledger._dispatch(v_run.run_id, v_run.queue_name);
      v_count := v_count + 1;
    end if;
  end loop;
  update runledger.workers set stopped_at = v_now where worker_id = p_worker_id;
  return v_count;
end;
$function$;
COMMENT ON FUNCTION runledger._stop_worker(text) IS 'Graceful worker stop: every run the worker still holds is given back at once (event released, not a recovery attempt): a RUNNING one goes back to PENDING, a CANCELLING one stays CANCELLING without an owner for the next claim to finish its cancel. Marks the worker stopped; returns how many runs it released.';

CREATE OR REPLACE FUNCTION runledger._stream_poll(p_run_id text, p_topic text, p_from_offset bigint, p_limit integer)
 RETURNS TABLE("offset" bigint, chunk jsonb, attempt integer, end_offset bigint, run_status text)
 LANGUAGE plpgsql
 STABLE SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_status text;
  v_end    bigint;
begin
  select r.status::text into v_status from runledger.runs r where r.run_id = p_run_id;
  if not found then
    raise exception using errcode = 'RL002', message = format('stream: run %s not found', p_run_id);
  end if;
  select e.end_offset into v_end from runledger.stream_ends e where e.run_id = p_run_id and e.topic = p_topic;
  return query
    select c."offset", c.chunk, c.attempt, v_end, v_status
      from runledger.stream_chunks c
     where c.run_id = p_run_id and c.topic = p_topic and c."offset" >= p_from_offset
     order by c."offset"
     limit p_limit;
  if not found then
    return query select null::bigint, null::jsonb, null::int, v_end, v_status;
  end if;
end;
$function$;
COMMENT ON FUNCTION runledger._stream_poll(text,text,bigint,integer) IS 'A reader''s poll (engine.readStream): up to p_limit chunks of the stream from p_from_offset in offset order, each with the stream''s end offset (null while open) and the run''s status as read before the chunks; one row with a null offset when there is no chunk there yet. RL002 for an unknown run.';

CREATE OR REPLACE FUNCTION runledger._stream_write(p_run_id text, p_token bigint, p_topic text, p_attempt integer, p_first_offset bigint, p_base_seq integer, p_after_earlier boolean, p_seqs integer[], p_chunks jsonb, p_close boolean DEFAULT false)
 RETURNS bigint
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_token  bigint;
  v_status runledger.run_status;
  v_first  bigint := p_first_offset;
  v_count  int := coalesce(jsonb_array_length(p_chunks), 0);
  v_end    bigint;
  v_stored int := 0;
  v_closed int := 0;
begin
  select r.fencing_token, r.status into v_token, v_status from runledger.runs r where r.run_id = p_run_id;
  if not found or v_token is distinct from p_token or v_status not in ('RUNNING', 'CANCELLING') then
    raise exception using errcode = 'RL001',
      message = format('run %s: lease lost (fencing token %s is stale or the run stopped executing); stream %s not written', p_run_id, p_token, p_topic);
  end if;
  if p_topic is null or p_topic !~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]*$' or length(p_topic) > 100 then
    raise exception using errcode = 'RL003', message = format('stream: invalid topic %L', p_topic);
  end if;
  if coalesce(cardinality(p_seqs), 0) <> v_count or (v_first is null and p_base_seq is null) or v_first < 0 then
    raise exception using errcode = 'RL003',
      message = format('stream %s: %s chunks with %s positions, first offset %s, base position %s', p_topic, v_count, coalesce(cardinality(p_seqs), 0), v_first, p_base_seq);
  end if;
  if v_first is null then
    -- The primary key read backwards from the stream's end, skipping the chunks of
    -- positions at or after p_base_seq (only an earlier execution that got further wrote any).
    select c."offset" + 1 into v_first
      from runledger.stream_chunks c
     where c.run_id = p_run_id and c.topic = p_topic
       and (c.seq < p_base_seq or (p_after_earlier and c.seq = p_base_seq and c.fencing_token < p_token))
     order by c."offset" desc
     limit 1;
    v_first := coalesce(v_first, 0);
  end if;
  select e.end_offset into v_end from runledger.stream_ends e where e.run_id = p_run_id and e.topic = p_topic;
  if v_count > 0 then
    insert into runledger.stream_chunks (run_id, topic, "offset", chunk, seq, attempt, fencing_token)
    select p_run_id, p_topic, v_first + c.i - 1, c.chunk, c.seq, p_attempt, p_token
      from rows from (jsonb_array_elements(p_chunks), unnest(p_seqs)) with ordinality as c(chunk, seq, i)
     where v_end is null or v_first + c.i - 1 < v_end
    on conflict do nothing;
    get diagnostics v_stored = row_count;
  end if;
  if p_close and v_end is null then
    insert into runledger.stream_ends (run_id, topic, end_offset, seq, fencing_token)
    values (p_run_id, p_topic, v_first + v_count, coalesce(p_seqs[v_count], p_base_seq, 0), p_token)
    on conflict do nothing;
    get diagnostics v_closed = row_count;
  end if;
  -- Readers are woken by the run's id only, once per batch; nothing new (a replay), no wake-up.
  if v_stored > 0 or v_closed > 0 then
    perform pg_notify('runledger_stream', p_run_id);
  end if;
  return v_first + v_count;
end;
$function$;
COMMENT ON FUNCTION runledger._stream_write(text,bigint,text,integer,bigint,integer,boolean,integer[],jsonb,boolean) IS 'Fenced (a read of the run''s fencing token and status, no row lock; RL001 when stale): stores a batch of one stream''s chunks (p_chunks, a JSON array, each at the step position in p_seqs) at consecutive offsets from p_first_offset, or, when it is null, after the last chunk written at positions before p_base_seq; an offset already stored, or at or past the stream''s end, is left as it is. p_close closes the stream after the batch. One NOTIFY runledger_stream (payload: the run id) when anything was stored. Returns the offset after the batch.';

CREATE OR REPLACE FUNCTION runledger._sub_amounts(p_a jsonb, p_b jsonb)
 RETURNS jsonb
 LANGUAGE sql
 IMMUTABLE
AS $function$
  select coalesce(jsonb_object_agg(k, d), '{}'::jsonb)
    from (select k, coalesce((p_a->>k)::numeric, 0) - coalesce((p_b->>k)::numeric, 0) as d
            from (select jsonb_object_keys(coalesce(p_a, '{}'::jsonb)) union select jsonb_object_keys(coalesce(p_b, '{}'::jsonb))) keys(k)) x
   where d <> 0
$function$;
COMMENT ON FUNCTION runledger._sub_amounts(jsonb,jsonb) IS 'The difference per key of two objects of numbers (a - b); keys whose difference is 0 are left out.';

CREATE OR REPLACE FUNCTION runledger._take_migration(p_pairs text[])
 RETURNS TABLE(run_id text, workflow_name text, from_version text, to_version text, status runledger.run_status, input jsonb, version_manifest jsonb, checkpoints jsonb)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
begin
  -- A marked run that finished on its old version meanwhile is not migrated.
  with dropped as (
    update runledger.runs r set migrate_to = null
     where r.migrate_to is not null and runledger.is_terminal(r.status) and r.status <> 'DEAD_LETTER'
    returning r.run_id, r.workflow_version, r.status, r.fencing_token)
  insert into runledger.events (run_id, kind, detail, fencing_token)
  select d.run_id, 'migration_dropped', jsonb_build_object('version', d.workflow_version, 'status', d.status), d.fencing_token
    from dropped d;
  return query
  select r.run_id, r.workflow_name, r.workflow_version, r.migrate_to, r.status, r.input, r.version_manifest,
         -- output wrapped in a one-element array, as claims return it: JSON null and "no value" stay distinct.
         coalesce((select jsonb_agg(jsonb_build_object('seq', s.seq, 'name', s.name, 'kind', s.kind, 'status', s.status,
                                                       'output', case when s.output is null then null else jsonb_build_array(s.output) end,
                                                       'error', s.error) order by s.seq)
                     from runledger.steps s where s.run_id = r.run_id), '[]')
    from (select m.run_id from runledger.runs m
           where m.migrate_to is not null and runledger._migratable(m.status)
             and (m.workflow_name || '@' || m.workflow_version || '>' || m.migrate_to) = any(p_pairs)
           order by m.updated_at
           limit 1
           for update skip locked) t
    join runledger.runs r on r.run_id = t.run_id;
end;
$function$;
COMMENT ON FUNCTION runledger._take_migration(text[]) IS 'A worker''s migrator: locks one run marked for a migration it has (pairs: workflow@from>to) and returns its input, manifest and checkpoints; the worker then calls _apply_migration or, after rolling back, _migration_failed. Also clears the mark of runs that finished meanwhile (event migration_dropped).';

CREATE OR REPLACE FUNCTION runledger._tenant_unbound()
 RETURNS boolean
 LANGUAGE sql
 STABLE SECURITY DEFINER
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
  select coalesce((select r.rolsuper or r.rolbypassrls from pg_roles r where r.rolname = runledger._caller()), false)
      or pg_has_role(runledger._caller(), (select n.nspowner from pg_namespace n where n.nspname = 'runledger'), 'MEMBER')
      or (exists (select from pg_roles r where r.rolname = 'runledger_worker')
          and pg_has_role(runledger._caller(), 'runledger_worker', 'MEMBER'))
$function$;
COMMENT ON FUNCTION runledger._tenant_unbound() IS 'True when tenant isolation does not restrict the caller: a superuser or BYPASSRLS role, the schema''s owner (or a member), or a member of runledger_worker. The policies call it once per statement.';

CREATE OR REPLACE FUNCTION runledger._terminate_run(p_run_id text, p_token bigint, p_reason text, p_evidence jsonb)
 RETURNS text
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_run runledger.runs;
begin
  v_run := runledger._lock_executing(p_run_id, p_token);
  if v_run.stop_record is null and runledger._compensations_due(p_run_id) then
    -- Its work was cut short, so what it did is undone first: the owner (it holds the
    -- lease still) runs the compensations as for a cancel, and the run ends TERMINATED
    -- with this record (_finish_run). If the owner dies, recovery hands the run to the
    -- next worker's claim, as for a cancel.
    perform runledger._stop_for_compensations(v_run, 'TERMINATED', p_reason, p_evidence, null, true);
    return 'CANCELLING';
  end if;
  perform runledger._finish_run(p_run_id, p_token, 'TERMINATED', p_reason, null, null, p_evidence, null);
  perform runledger._cancel_children(p_run_id, format('parent %s ended %s', p_run_id, p_reason));
  return 'TERMINATED';
end;
$function$;
COMMENT ON FUNCTION runledger._terminate_run(text,bigint,text,jsonb) IS 'Fenced policy stop by the run''s owner: TERMINATED with reason (DEADLINE, MAX_STEPS, BUDGET, NO_PROGRESS) and evidence; children are cancelled. A run with compensations due becomes CANCELLING instead, still owned, with that record as its stop_record: it ends TERMINATED once they have run. Returns the new status.';

CREATE OR REPLACE FUNCTION runledger._test_clock_now()
 RETURNS timestamp with time zone
 LANGUAGE plpgsql
 PARALLEL SAFE SECURITY DEFINER COST 1
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
begin
  if coalesce((select s.test_clock from runledger.owner_settings s), false) then
    return coalesce(nullif(current_setting('runledger.fake_now', true), '')::timestamptz,
                    clock_timestamp() + coalesce(nullif(current_setting('runledger.clock_offset', true), '')::interval, interval '0'));
  end if;
  return clock_timestamp();
end;
$function$;
COMMENT ON FUNCTION runledger._test_clock_now() IS 'runledger.now() of a session that set runledger.fake_now or runledger.clock_offset: the setting''s time when the schema''s owner switched the test clock on (owner_settings.test_clock), else clock_timestamp(). Every role may call it (now() is inlined into their queries); it runs as the owner.';

CREATE OR REPLACE FUNCTION runledger._trace_execution(p_run_id text, p_token bigint, p_traceparent text)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
begin
  if p_traceparent is null or not runledger._is_traceparent(p_traceparent) then
    raise exception using errcode = 'RL003',
      message = format('_trace_execution: %L is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)', p_traceparent);
  end if;
  update runledger.runs r set execution_traceparent = p_traceparent
   where r.run_id = p_run_id and r.fencing_token = p_token and r.lease_owner is not null;
  return found;
end;
$function$;
COMMENT ON FUNCTION runledger._trace_execution(text,bigint,text) IS 'Records p_traceparent, the span of the execution that holds the run with fencing token p_token, in runs.execution_traceparent (the next execution''s span links to it). Returns false, writing nothing, when that execution no longer holds the run. RL003 for a value that is not a W3C traceparent.';

CREATE OR REPLACE FUNCTION runledger._transition_pairs()
 RETURNS text[]
 LANGUAGE sql
 IMMUTABLE
AS $function$
  select array_agg(t.from_status::text || '>' || t.to_status::text order by t.from_status, t.to_status)
    from runledger.run_transitions() t
$function$;
COMMENT ON FUNCTION runledger._transition_pairs() IS 'run_transitions() as from>to pairs (''RUNNING>SUCCEEDED''), for _check_run (the trigger runs_invariants).';

CREATE OR REPLACE FUNCTION runledger._truncate_run_history()
 RETURNS trigger
 LANGUAGE plpgsql
AS $function$
begin
  truncate runledger.steps, runledger.events;
  return null;
end;
$function$;
COMMENT ON FUNCTION runledger._truncate_run_history() IS 'Trigger function of runs_truncate_history: TRUNCATE of runs empties steps and events (there is no foreign key to cascade through).';

CREATE OR REPLACE FUNCTION runledger._undone_operations(p_run_id text, p_before_seq integer DEFAULT NULL::integer)
 RETURNS jsonb
 LANGUAGE sql
 STABLE
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
  -- An operation checkpoint names its ledger row (output.operationId). A fork's copied or
  -- reused checkpoint names a row of an ancestor (copied: that row; reused: the fork's own
  -- row, attempts 0, whose effect is the ancestor's, prior_operation_id): the effect is the
  -- ancestor's, and its undo counts too.
  select coalesce(jsonb_agg(jsonb_build_object('seq', s.seq, 'name', s.name, 'operation_id', coalesce(p.operation_id, o.operation_id),
                                               'run_id', coalesce(p.run_id, o.run_id),
                                               'compensation', coalesce(p.compensation_status, o.compensation_status))
                            order by s.seq), '[]'::jsonb)
    from runledger.steps s
    join runledger.operations o on o.operation_id = s.output->>'operationId'
    left join runledger.operations p on o.attempts = 0 and p.operation_id = o.prior_operation_id
   where s.run_id = p_run_id and s.kind = 'operation' and s.status = 'SUCCEEDED'
     and (p_before_seq is null or s.seq < p_before_seq)
     and coalesce(p.compensation_status, o.compensation_status) is not null
$function$;
COMMENT ON FUNCTION runledger._undone_operations(text,integer) IS 'The operation checkpoints of a run (those before p_before_seq; all when null) whose effect a compensation undid (compensation_status DONE) or tried to (STARTED: cut short, FAILED), the ancestor''s operation for a checkpoint a fork copied or reused: a JSON array of {seq, name, operation_id, run_id, compensation}, by seq; [] when there is none. retry_run, migrate_run and fork_run refuse to go on from such a checkpoint.';

CREATE OR REPLACE FUNCTION runledger._undone_refusal(p_what text, p_run_id text, p_undone jsonb)
 RETURNS text
 LANGUAGE sql
 IMMUTABLE
AS $function$
  select format('%s: run %s has operations whose effects were undone by compensations (%s); going on from its checkpoints '
                'would act as if they stood. To do that work again, fork the run from step %s or earlier '
                '(runledger fork %s --from %s, or select runledger.fork_run(%L, %s)): the fork calls each undone operation '
                'again, as a new attempt under its idempotency key%s',
                p_what, p_run_id,
                (select string_agg(format('%s at step %s: compensation %s', u->>'name', u->>'seq', u->>'compensation'), ', ' order by (u->>'seq')::int)
                   from jsonb_array_elements(p_undone) u),
                p_undone->0->>'seq', p_run_id, p_undone->0->>'seq', p_run_id, p_undone->0->>'seq',
                case when exists (select from jsonb_array_elements(p_undone) u where u->>'compensation' <> 'DONE')
                     then '. A compensation FAILED or cut short (STARTED) is finished first: compensate_run tries it again'
                     else '' end)
$function$;
COMMENT ON FUNCTION runledger._undone_refusal(text,text,jsonb) IS 'The message of the RL005 that retry_run, migrate_run and fork_run raise for a run with undone operations (runledger._undone_operations): names each, and says to fork the run from the first one''s step (and to finish a FAILED or STARTED compensation with compensate_run first).';

CREATE OR REPLACE FUNCTION runledger._wait(p_run_id text, p_token bigint, p_seq integer, p_name text, p_kind text, p_spec jsonb)
 RETURNS TABLE(done boolean, output jsonb)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_now      timestamptz := runledger.now();
  v_run      runledger.runs;
  v_step     runledger.steps;
  v_wake_at  timestamptz;
  v_key      text;
  v_signal   runledger.signals;
  v_approval runledger.approvals;
  v_child    runledger.runs;
begin
  perform runledger._fence(p_run_id, p_token);
  select * into v_run from runledger.runs where run_id = p_run_id;

  -- First encounter: the wake time (timeout) is computed once, on the database clock, and kept.
  select * into v_step from runledger.steps where run_id = p_run_id and seq = p_seq;
  if not found then
    if p_spec ? 'until' then
      v_wake_at := runledger._instant(p_spec->>'until', format('run %s: %s %s until', p_run_id, p_kind, p_name));
    elsif p_spec ? 'timeout_ms' then
      if jsonb_typeof(p_spec->'timeout_ms') <> 'number' then
        raise exception using errcode = 'RL003',
          message = format('run %s: %s %s: timeout_ms must be a number of milliseconds, not %s', p_run_id, p_kind, p_name, p_spec->'timeout_ms');
      end if;
      v_wake_at := runledger._ms_after(v_now, (p_spec->>'timeout_ms')::numeric, format('run %s: %s %s timeout_ms', p_run_id, p_kind, p_name));
    end if;
    if p_kind = 'sleep' and v_wake_at is null then
      -- A timer without a wake-up time would wait forever.
      raise exception using errcode = 'RL003', message = format('run %s: sleep %s has no duration or time (spec %s)', p_run_id, p_name, p_spec);
    end if;
    insert into runledger.steps (run_id, seq, name, kind, status, output, started_at, finished_at, fencing_token)
    values (p_run_id, p_seq, p_name, p_kind, 'WAITING',
            jsonb_strip_nulls(jsonb_build_object('wake_at', v_wake_at, 'spec', p_spec)), v_now, v_now, p_token)
    returning * into v_step;
    if p_kind = 'approval' then
      insert into runledger.approvals (request_id, run_id, seq, name, action, evidence, approvers, required, expires_at)
      values (coalesce(p_spec->>'request_id', runledger._new_id()), p_run_id, p_seq, p_name, p_spec->>'action', p_spec->'evidence',
              (select array_agg(a) from jsonb_array_elements_text(p_spec->'approvers') a), coalesce((p_spec->>'required')::int, 1), v_wake_at);
    end if;
    insert into runledger.events (run_id, kind, detail, fencing_token, at)
    values (p_run_id, 'wait_started', jsonb_build_object('seq', p_seq, 'name', p_name, 'kind', p_kind, 'wake_at', v_wake_at), p_token, v_now);
  end if;
  v_wake_at := (v_step.output->>'wake_at')::timestamptz;

  -- Can the wait end now? Its result and the step's completion commit together.
  if p_kind = 'signal' then
    v_key := p_spec->>'topic';
    select * into v_signal from runledger.signals s
     where s.run_id = p_run_id and s.topic = v_key and s.consumed_seq is null
     order by s.received_at, s.signal_id limit 1
     for update;
    if found then
      update runledger.signals set consumed_seq = p_seq, consumed_at = v_now where signal_id = v_signal.signal_id;
      perform runledger._end_wait(p_run_id, p_seq, jsonb_build_object('payload', v_signal.payload, 'signal_id', v_signal.signal_id));
      return query select true, jsonb_build_object('payload', v_signal.payload, 'signal_id', v_signal.signal_id);
      return;
    end if;
  elsif p_kind = 'approval' then
    select * into v_approval from runledger.approvals a where a.run_id = p_run_id and a.seq = p_seq;
    v_key := v_approval.request_id;
    if v_approval.decision is not null then
      perform runledger._end_wait(p_run_id, p_seq, jsonb_build_object(
        'approved', v_approval.decision, 'decidedBy', v_approval.decided_by, 'decidedAt', v_approval.decided_at,
        'note', v_approval.note, 'requestId', v_approval.request_id)
        || case when v_approval.required > 1 then jsonb_build_object('votes', runledger._approval_votes(v_approval.request_id)) else '{}' end);
      return query select s.status = 'SUCCEEDED', s.output from runledger.steps s where s.run_id = p_run_id and s.seq = p_seq;
      return;
    end if;
  elsif p_kind = 'child' then
    v_key := p_spec->>'child_run_id';
    select * into v_child from runledger.runs where run_id = v_key;
    if not found then
      raise exception using errcode = 'RL002', message = format('run %s waits for child %s, which does not exist', p_run_id, v_key);
    end if;
    if runledger.is_terminal(v_child.status) then
      perform runledger._end_wait(p_run_id, p_seq, jsonb_build_object(
        'runId', v_child.run_id, 'status', v_child.status, 'output', v_child.output, 'error', v_child.error,
        'terminationReason', v_child.termination_reason));
      return query select true, s.output from runledger.steps s where s.run_id = p_run_id and s.seq = p_seq;
      return;
    end if;
  end if;

  if v_wake_at is not null and v_wake_at <= v_now then
    -- Timer due (a sleep's end, or a wait's timeout: the wait returns null).
    perform runledger._end_wait(p_run_id, p_seq, case when p_kind = 'sleep' then jsonb_build_object('woke_at', v_now) else jsonb_build_object('timed_out', true) end);
    return query select true, s.output from runledger.steps s where s.run_id = p_run_id and s.seq = p_seq;
    return;
  end if;

  -- Park the run: WAITING, no lease, woken by its timer (the earlier of the wait's wake
  -- time and the run's deadline), a signal, a decision or a child's end. The delay is a
  -- bigint of milliseconds: a timer may be months or years ahead.
  v_wake_at := least(v_wake_at, v_run.deadline_at);
  update runledger.runs
     set status = 'WAITING', wait_kind = case p_kind when 'sleep' then 'timer' else p_kind end, wait_key = v_key,
         wake_at = v_wake_at, lease_owner = null, lease_expires_at = null, updated_at = v_now
   where run_id = p_run_id;
  perform runledger._slot_freed(p_run_id);
  if v_wake_at is not null then
    perform runledger._dispatch(p_run_id, v_run.queue_name,
      greatest(0, ceil(extract(epoch from v_wake_at - v_now) * 1000))::bigint);
  end if;
  return query select false, null::jsonb;
end;
$function$;
COMMENT ON FUNCTION runledger._wait(text,bigint,integer,text,text,jsonb) IS 'A durable wait at step p_seq (sleep, signal, approval, child), in one round trip: fences, records the wait once (its wake time is a checkpoint: until, a finite timestamp, or timeout_ms, milliseconds from 0 to 2^53 - 1 after now; RL003 otherwise), ends it when it can (consuming a signal, reading a decision or a child''s end, or timing out) in the same transaction, else parks the run WAITING without a lease and schedules its timer.';

CREATE OR REPLACE FUNCTION runledger._wake(p_run_id text, p_kind text, p_key text)
 RETURNS boolean
 LANGUAGE plpgsql
AS $function$
declare
  v_run runledger.runs;
begin
  -- Lock the run first. A transaction parking it right now (its _wait holds the row) has
  -- not committed WAITING yet, and under READ COMMITTED the UPDATE below would skip a row
  -- whose committed version is still RUNNING without waiting for it: the wake-up would be
  -- lost and the run would wait forever. Locked, this statement waits for the parking to
  -- commit, and the UPDATE (a new snapshot) then sees it.
  perform 1 from runledger.runs where run_id = p_run_id for update;
  -- Compare-and-set: only a run still waiting for exactly this thing is woken.
  update runledger.runs
     set status = 'PENDING', wait_kind = null, wait_key = null, wake_at = null, updated_at = runledger.now()
   where run_id = p_run_id and status = 'WAITING' and wait_kind = p_kind and wait_key is not distinct from p_key
  returning * into v_run;
  if not found then
    return false;
  end if;
  insert into runledger.events (run_id, kind, detail) values (p_run_id, 'woken', jsonb_build_object('wait_kind', p_kind, 'key', p_key));
  perform runledger._make_runnable(p_run_id, 0);
  return true;
end;
$function$;
COMMENT ON FUNCTION runledger._wake(text,text,text) IS 'Moves a run WAITING for (kind, key) back to PENDING and dispatches it; false when it is not waiting for that.';

CREATE OR REPLACE FUNCTION runledger._wake_due(p_limit integer DEFAULT 1000, p_grace_ms integer DEFAULT 0)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_run   runledger.runs;
  v_count int := 0;
begin
  -- Workers claim the due timers of the queues they serve (_claim_batch). This sweep
  -- covers queues no live worker claims from, and clocks moved with runledger.fake_now in tests.
  for v_run in
    select * from runledger.runs r
     where r.status = 'WAITING' and r.wake_at <= runledger.now() - make_interval(secs => p_grace_ms / 1000.0)
     order by r.wake_at
     limit p_limit
     for update skip locked
  loop
    if runledger._wake(v_run.run_id, v_run.wait_kind, v_run.wait_key) then
      v_count := v_count + 1;
    end if;
  end loop;
  return v_count;
end;
$function$;
COMMENT ON FUNCTION runledger._wake_due(integer,integer) IS 'Sweeper: wakes WAITING runs whose wake time passed more than p_grace_ms ago (workers claim due timers themselves; this covers queues no live worker claims from, and clocks moved by runledger.fake_now). Returns how many.';

CREATE OR REPLACE FUNCTION runledger._wake_parent(p_child_run_id text)
 RETURNS boolean
 LANGUAGE plpgsql
AS $function$
declare
  v_parent text;
begin
  select r.parent_run_id into v_parent from runledger.runs r where r.run_id = p_child_run_id;
  if v_parent is null then
    return false;
  end if;
  return runledger._wake(v_parent, 'child', p_child_run_id);
end;
$function$;
COMMENT ON FUNCTION runledger._wake_parent(text) IS 'Called when a run reaches a terminal state: wakes its parent if the parent waits for it.';

CREATE OR REPLACE FUNCTION runledger._wake_rate_limited(p_key text)
 RETURNS integer
 LANGUAGE plpgsql
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
declare
  v_woken int := 0;
  v_run_id text;
begin
  for v_run_id in
    select r.run_id from runledger.runs r
     where r.status = 'WAITING' and r.wait_kind = 'rate_limit' and r.wait_key = p_key
       and r.run_id in (select w.run_id from runledger.rate_limit_waiters w where w.key = p_key)
  loop
    if runledger._wake(v_run_id, 'rate_limit', p_key) then
      v_woken := v_woken + 1;
    end if;
  end loop;
  return v_woken;
end;
$function$;
COMMENT ON FUNCTION runledger._wake_rate_limited(text) IS 'Wakes the runs parked on a rate limit key (wait_kind rate_limit) so they ask for a permit again; run when the key''s limit or pause changes. Returns how many it woke.';

CREATE OR REPLACE FUNCTION runledger.cancel_run(p_run_id text, p_reason text DEFAULT NULL::text)
 RETURNS text
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_status text := runledger._cancel_run(p_run_id, p_reason);
begin
  perform runledger._audit('cancel_run', p_run_id, null, jsonb_build_object('reason', p_reason), to_jsonb(v_status));
  return v_status;
end;
$function$;
COMMENT ON FUNCTION runledger.cancel_run(text,text) IS 'Operator action: cancels a run (and its unfinished child runs). PENDING and WAITING runs end at once (CANCELLED, or CANCELLING when compensations are due); a RUNNING run is stopped by its worker. Returns the run''s new status; a finished run is left as it is. Recorded in audit_log.';

CREATE OR REPLACE FUNCTION runledger.clear_retention(p_kind text, p_workflow_name text DEFAULT NULL::text)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_found boolean;
begin
  -- The rules apply to every tenant's data (0014_security.sql).
  perform runledger._check_not_tenant_bound('clear_retention');
  v_found := runledger._clear_retention(p_kind, p_workflow_name);
  perform runledger._audit('clear_retention', null, p_kind, jsonb_build_object('workflow_name', p_workflow_name), to_jsonb(v_found));
  return v_found;
end;
$function$;
COMMENT ON FUNCTION runledger.clear_retention(text,text) IS 'Operator action: removes the rule for kind and workflow (null: the default); the workflow falls back to the default, the default to keep forever. Returns whether a rule was removed. With tenant isolation on, refused (42501) to an operator bound to a tenant. Recorded in audit_log, and that record is never pruned.';

CREATE OR REPLACE FUNCTION runledger.compensate_run(p_run_id text, p_reason text DEFAULT NULL::text)
 RETURNS text
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_status text := runledger._compensate_run(p_run_id, p_reason);
begin
  perform runledger._audit('compensate_run', p_run_id, null, jsonb_build_object('reason', p_reason), to_jsonb(v_status));
  return v_status;
end;
$function$;
COMMENT ON FUNCTION runledger.compensate_run(text,text) IS 'Operator action: runs the compensations of a finished run (FAILED, CANCELLED, TERMINATED, DEAD_LETTER) that are not DONE, on a worker serving its version; the run keeps its status. Returns CANCELLING while they run, or the run''s status when none is left. Recorded in audit_log.';

CREATE OR REPLACE FUNCTION runledger.decide_approval(p_request_id text, p_approved boolean, p_decided_by text, p_note text DEFAULT NULL::text)
 RETURNS jsonb
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_decision jsonb := runledger._decide_approval(p_request_id, p_approved, p_decided_by, p_note);
begin
  perform runledger._audit('decide_approval', (select a.run_id from runledger.approvals a where a.request_id = p_request_id),
                           p_request_id, jsonb_build_object('approved', p_approved, 'note', p_note), v_decision, p_decided_by);
  return v_decision;
end;
$function$;
COMMENT ON FUNCTION runledger.decide_approval(text,boolean,text,text) IS 'Decides a pending approval request. The first decision wins and stays as audit evidence (with the deciding login and role); later calls return it with recorded = false. An approver outside the request''s list: RL007; expired request: RL005. Wakes the waiting run. Recorded in audit_log.';

CREATE OR REPLACE FUNCTION runledger.delete_rate_limit(p_key text)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_found boolean;
begin
  perform runledger._check_not_tenant_bound('delete_rate_limit');
  delete from runledger.rate_limit_keys where key = p_key;
  v_found := found;
  perform runledger._wake_rate_limited(p_key);
  perform runledger._audit('delete_rate_limit', null, p_key, null, to_jsonb(v_found));
  return v_found;
end;
$function$;
COMMENT ON FUNCTION runledger.delete_rate_limit(text) IS 'Operator action: removes the key (its limit, its pause, its log of calls): calls naming it are no longer limited, and the runs waiting on it are woken. False when there was no such key. Recorded in audit_log.';

CREATE OR REPLACE FUNCTION runledger.delete_session(p_session_id text)
 RETURNS integer
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_removed int := runledger._delete_session(p_session_id);
begin
  perform runledger._audit('delete_session', null, p_session_id,
                           jsonb_build_object('tenant_id', nullif(runledger._session_scope(), '')), to_jsonb(v_removed));
  return v_removed;
end;
$function$;
COMMENT ON FUNCTION runledger.delete_session(text) IS 'Operator action: deletes a session (of the tenant the caller''s session names in runledger.tenant; none: the runs without a tenant) that no run holds or waits for, with its entries; returns how many entries it removed. Recorded in audit_log, with the tenant.';

CREATE OR REPLACE FUNCTION runledger.disable_tenant_isolation()
 RETURNS text[]
 LANGUAGE plpgsql
AS $function$
declare
  v_table text;
begin
  foreach v_table in array runledger._isolated_tables() loop
    execute format('alter table runledger.%I no force row level security, disable row level security', v_table);
  end loop;
  return runledger._isolated_tables();
end;
$function$;
COMMENT ON FUNCTION runledger.disable_tenant_isolation() IS 'Switches tenant isolation off (row-level security off on the tables enable_tenant_isolation() names). Run by the schema''s owner.';

CREATE OR REPLACE FUNCTION runledger.enable_tenant_isolation()
 RETURNS text[]
 LANGUAGE plpgsql
AS $function$
declare
  v_table text;
  v_exempt text;
begin
  if not exists (select from pg_roles where rolname = 'runledger_worker') then
    raise exception using errcode = '42704',
      message = 'enable_tenant_isolation: the role runledger_worker does not exist (run select runledger.grant_roles() first): without it every worker would be bound to a tenant';
  end if;
  -- PostgreSQL exempts superusers and BYPASSRLS roles from row-level security, forced or
  -- not, and the views and the SECURITY DEFINER functions run as their owner.
  select string_agg(distinct format('%s (owned by %s)', o.what, r.rolname), ', ') into v_exempt
    from (select c.oid::regclass::text as what, c.relowner as owner from pg_class c
           where c.relnamespace = 'runledger'::regnamespace and c.relkind in ('r', 'v')
          union all
          select p.oid::regprocedure::text, p.proowner from pg_proc p
           where p.pronamespace = 'runledger'::regnamespace and p.prosecdef) o
    join pg_roles r on r.oid = o.owner
   where r.rolsuper or r.rolbypassrls;
  if v_exempt is not null then
    raise exception using errcode = '55000',
      message = 'enable_tenant_isolation: the runledger schema is owned by a superuser or BYPASSRLS role, which row-level security never restricts, so its views and functions would show every tenant: ' || left(v_exempt, 300),
      hint = 'Migrate as a role that is neither superuser nor BYPASSRLS (docs/security.md, tenant isolation), or hand the schema''s objects to one: REASSIGN OWNED BY old_owner TO new_owner.';
  end if;
  foreach v_table in array runledger._isolated_tables() loop
    execute format('alter table runledger.%I enable row level security, force row level security', v_table);
  end loop;
  return runledger._isolated_tables();
end;
$function$;
COMMENT ON FUNCTION runledger.enable_tenant_isolation() IS 'Switches tenant isolation on: row-level security, forced, on every table that holds a run''s data. Readers and operators then see and act on only the runs of the tenant their session names (set runledger.tenant = ''...''; see tenant_members); workers, the owner and BYPASSRLS roles see all. Refused (55000) while the schema''s objects belong to a superuser or BYPASSRLS role, which row-level security cannot restrict. Returns the tables. Run by the schema''s owner.';

CREATE OR REPLACE FUNCTION runledger.fork_run(p_run_id text, p_from_step integer, p_version text DEFAULT NULL::text)
 RETURNS text
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_fork text := runledger._fork_run(p_run_id, p_from_step, p_version);
begin
  perform runledger._audit('fork_run', p_run_id, v_fork, jsonb_build_object('from_step', p_from_step, 'version', p_version), to_jsonb(v_fork));
  return v_fork;
end;
$function$;
COMMENT ON FUNCTION runledger.fork_run(text,integer,text) IS 'Operator action: starts a new run of the same workflow and input that reuses the source run''s checkpoints before step from_step (0 = start over) and runs the rest, on the source''s version or on version (a registered version of the workflow, with its manifest). Returns the new run_id. Operations copied this way are not compensated by the fork. Recorded in audit_log.';

CREATE OR REPLACE FUNCTION runledger.grant_roles()
 RETURNS TABLE(role_name text, functions integer, relations integer)
 LANGUAGE plpgsql
AS $function$
declare
  v_role text;
  v_fn regprocedure;
  v_rel regclass;
begin
  foreach v_role in array array['runledger_worker', 'runledger_operator', 'runledger_reader'] loop
    if not exists (select from pg_roles where rolname = v_role) then
      begin
        execute format('create role %I nologin', v_role);
      exception
        when duplicate_object or unique_violation then null;  -- created meanwhile by a migration of another database
        when insufficient_privilege then
          raise exception 'runledger.grant_roles: role % does not exist and % may not create roles', v_role, session_user
            using errcode = '42501',
                  hint = 'Run select runledger.grant_roles() as a role with CREATEROLE (a DBA), or create the roles runledger_worker, runledger_operator and runledger_reader first.';
      end;
    end if;
    execute format('grant usage on schema runledger to %I', v_role);
    -- Start from nothing, so a function taken off a list loses its grant.
    for v_fn in select p.oid::regprocedure from pg_proc p where p.pronamespace = 'runledger'::regnamespace loop
      execute format('revoke all on function %s from %I', v_fn, v_role);
    end loop;
    for v_rel in select c.oid::regclass from pg_class c
                  where c.relnamespace = 'runledger'::regnamespace and c.relkind in ('r', 'v', 'p', 'm', 'S') loop
      execute format('revoke all on %s from %I', v_rel, v_role);
    end loop;
    for v_fn in
      select p.oid::regprocedure from pg_proc p
       where p.pronamespace = 'runledger'::regnamespace
         and p.proname in (select f.function_name from runledger.role_functions f where f.role_name = v_role)
    loop
      execute format('grant execute on function %s to %I', v_fn, v_role);
    end loop;
    -- Reads: the reader sees the views only; workers and operators read tables and views.
    for v_rel in
      select c.oid::regclass from pg_class c
       where c.relnamespace = 'runledger'::regnamespace
         and (c.relkind = 'v' or (c.relkind in ('r', 'p') and v_role <> 'runledger_reader'))
    loop
      execute format('grant select on %s to %I', v_rel, v_role);
    end loop;
    -- Scheduled workflows: graphile-worker fires cron ticks from its own schema (installed by
    -- migrate before these files), with its own functions and tables.
    if v_role = 'runledger_worker' and exists (select from pg_namespace where nspname = 'graphile_worker') then
      execute 'grant usage on schema graphile_worker to runledger_worker';
      execute 'grant select, insert, update, delete on all tables in schema graphile_worker to runledger_worker';
      execute 'grant usage, select on all sequences in schema graphile_worker to runledger_worker';
      execute 'grant execute on all functions in schema graphile_worker to runledger_worker';
    end if;
    role_name := v_role;
    select count(*) into functions from pg_proc p
     where p.pronamespace = 'runledger'::regnamespace and has_function_privilege(v_role, p.oid, 'execute');
    select count(*) into relations from pg_class c
     where c.relnamespace = 'runledger'::regnamespace and c.relkind in ('r', 'v', 'p')
       and has_table_privilege(v_role, c.oid, 'select');
    return next;
  end loop;
end;
$function$;
COMMENT ON FUNCTION runledger.grant_roles() IS 'Creates the roles runledger_worker, runledger_operator and runledger_reader where missing (needs CREATEROLE) and grants each exactly its functions (runledger.role_functions) and reads (worker and operator: tables and views; reader: views), and the worker graphile-worker''s schema for cron. Idempotent; migrate runs it when the migrating role may create roles, otherwise a DBA runs it. Returns what each role may now execute and read.';

CREATE OR REPLACE FUNCTION runledger.is_terminal(p_status runledger.run_status)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
  select p_status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER')
$function$;
COMMENT ON FUNCTION runledger.is_terminal(runledger.run_status) IS 'True for the statuses a run never leaves on its own (retry_run, compensate_run and fork_run are explicit operator actions).';

CREATE OR REPLACE FUNCTION runledger.migrate_run(p_run_id text, p_to_version text)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_marked boolean := runledger._migrate_run(p_run_id, p_to_version);
begin
  perform runledger._audit('migrate_run', p_run_id, null, jsonb_build_object('to_version', p_to_version), to_jsonb(v_marked));
  return v_marked;
end;
$function$;
COMMENT ON FUNCTION runledger.migrate_run(text,text) IS 'Operator action: marks a PENDING, WAITING or DEAD_LETTER run to continue on version to_version of its workflow; a live worker with the migration applies it (event migrated, or migration_failed with the run left as it was). Returns false when the run was already marked for that version. Refused (nothing changed): an unknown run (RL002), a finished or executing run (RL005), no live worker with the version and the migration (RL006). Recorded in audit_log.';

CREATE OR REPLACE FUNCTION runledger.migrate_runs(p_workflow text, p_from_version text, p_to_version text, p_limit integer DEFAULT NULL::integer)
 RETURNS TABLE(run_id text, marked boolean, reason text)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_rows jsonb := (select coalesce(jsonb_agg(jsonb_build_object('run_id', m.id, 'marked', m.marked, 'reason', m.reason) order by m.n), '[]')
                     from runledger._migrate_runs(p_workflow, p_from_version, p_to_version, p_limit) with ordinality m(id, marked, reason, n));
  v_marked  jsonb := (select coalesce(jsonb_agg(e->'run_id'), '[]') from jsonb_array_elements(v_rows) e where (e->>'marked')::boolean);
  v_skipped jsonb := (select coalesce(jsonb_agg(jsonb_build_object('run_id', e->'run_id', 'reason', e->'reason')), '[]')
                        from jsonb_array_elements(v_rows) e where not (e->>'marked')::boolean);
begin
  perform runledger._audit('migrate_runs', null, p_workflow,
                           jsonb_build_object('from_version', p_from_version, 'to_version', p_to_version, 'limit', p_limit),
                           jsonb_build_object('marked', jsonb_array_length(v_marked), 'run_ids', v_marked,
                                              'skipped', jsonb_array_length(v_skipped), 'skipped_runs', v_skipped));
  return query select e->>'run_id', (e->>'marked')::boolean, e->>'reason' from jsonb_array_elements(v_rows) with ordinality x(e, n) order by x.n;
end;
$function$;
COMMENT ON FUNCTION runledger.migrate_runs(text,text,text,integer) IS 'Operator action: migrate_run for the PENDING, WAITING and DEAD_LETTER runs of workflow@from_version, oldest first, at most limit of them (the canary form). Returns a row per run: marked true for the runs it marked; false, with the reason, for a run it left on its version (another transaction held it locked at that moment: call again; its compensations undid an operation: fork it instead). Recorded in audit_log as one action, the runs it left included.';

CREATE OR REPLACE FUNCTION runledger.now()
 RETURNS timestamp with time zone
 LANGUAGE sql
 PARALLEL SAFE
AS $function$
  select case when coalesce(nullif(pg_catalog.current_setting('runledger.fake_now', true), ''),
                            nullif(pg_catalog.current_setting('runledger.clock_offset', true), '')) is null
              then pg_catalog.clock_timestamp()
              else runledger._test_clock_now() end
$function$;
COMMENT ON FUNCTION runledger.now() IS 'Current time for every runledger function: clock_timestamp(). Where the schema''s owner switched the test clock on (owner_settings.test_clock), a session''s setting runledger.fake_now (a frozen instant) or runledger.clock_offset (an interval: a clock running ahead or behind) moves it for that session; elsewhere those settings change nothing. Runs as its caller, so the planner inlines it.';

CREATE OR REPLACE FUNCTION runledger.pause_rate_limit(p_key text, p_until timestamp with time zone, p_note text DEFAULT NULL::text)
 RETURNS runledger.rate_limit_keys
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_limit runledger.rate_limit_keys;
begin
  perform runledger._check_not_tenant_bound('pause_rate_limit');
  if p_key is null or p_key !~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,99}$' then
    raise exception using errcode = 'RL003', message = format('pause_rate_limit: key %s is not a valid key', coalesce(quote_literal(p_key), 'null'));
  end if;
  if p_until is null or not isfinite(p_until) then
    raise exception using errcode = 'RL003', message = format('pause_rate_limit(%s): until must be a finite time', p_key);
  end if;
  insert into runledger.rate_limit_keys as k (key, paused_until, pause_reason)
  values (p_key, p_until, jsonb_build_object('by', runledger._caller(), 'note', p_note))
  on conflict (key) do update set paused_until = excluded.paused_until, pause_reason = excluded.pause_reason, updated_at = runledger.now()
  returning * into v_limit;
  perform runledger._wake_rate_limited(p_key);
  perform runledger._audit('pause_rate_limit', null, p_key, jsonb_build_object('until', p_until, 'note', p_note), to_jsonb(v_limit));
  return v_limit;
end;
$function$;
COMMENT ON FUNCTION runledger.pause_rate_limit(text,timestamp with time zone,text) IS 'Operator action: no call on the key before p_until, for every run (the circuit opened by hand; a time in the past lifts a pause). Replaces the key''s pause and wakes the runs waiting on it to ask again. Returns the key''s row. Recorded in audit_log.';

CREATE OR REPLACE FUNCTION runledger.prune(p_older_than interval)
 RETURNS bigint
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_count bigint;
begin
  perform runledger._check_not_tenant_bound('prune');
  v_count := runledger._prune(p_older_than);
  perform runledger._audit('prune', null, null, jsonb_build_object('older_than', p_older_than::text), to_jsonb(v_count));
  return v_count;
end;
$function$;
COMMENT ON FUNCTION runledger.prune(interval) IS 'Operator action: deletes finished runs (terminal, finished before now - older_than) with their steps, events, operations, signals and approvals, and workers stopped before then. Returns how many runs it removed. The audit log is kept. With tenant isolation on, refused (42501) to an operator bound to a tenant. Recorded in audit_log.';

CREATE OR REPLACE FUNCTION runledger.prune_artifact_blobs()
 RETURNS bigint
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_removed bigint;
begin
  perform runledger._check_not_tenant_bound('prune_artifact_blobs');
  v_removed := runledger._prune_artifact_blobs();
  perform runledger._audit('prune_artifact_blobs', null, null, '{}', to_jsonb(v_removed));
  return v_removed;
end;
$function$;
COMMENT ON FUNCTION runledger.prune_artifact_blobs() IS 'Operator action: deletes artifact contents no artifact refers to any more; returns how many it removed. With tenant isolation on, refused (42501) to an operator bound to a tenant: a blob is stored once for every tenant. Recorded in audit_log.';

CREATE OR REPLACE FUNCTION runledger.prune_due(p_batch integer DEFAULT 1000, p_dry_run boolean DEFAULT false)
 RETURNS TABLE(kind text, removed bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_kinds   text[];
  v_counts  bigint[];
begin
  -- A pass applies the rules every tenant shares; the workers (not bound to a tenant) make it.
  perform runledger._check_not_tenant_bound('prune_due');
  select array_agg(d.kind), array_agg(d.removed) into v_kinds, v_counts from runledger._prune_due(p_batch, p_dry_run) d;
  -- Recorded when it removed something: a worker's pass over nothing due leaves no trace.
  if not coalesce(p_dry_run, false) and exists (select 1 from unnest(v_counts) n where n > 0) then
    perform runledger._audit('prune_due', null, null, jsonb_build_object('batch', p_batch),
                             (select jsonb_object_agg(k, n) from unnest(v_kinds, v_counts) u (k, n)));
  end if;
  return query select u.k, u.n from unnest(v_kinds, v_counts) u (k, n);
end;
$function$;
COMMENT ON FUNCTION runledger.prune_due(integer,boolean) IS 'Operator action (and the workers'' retention task): applies runledger.retention, one batch of at most p_batch rows per kind: idempotency keys of finished runs cleared, events, signals and streams of finished runs, finished runs with everything they own, idle sessions with their entries, audit records (never one younger than owner_settings.audit_log_min_keep, nor a record of set_retention, clear_retention or owner_settings). Never a run that is not terminal, whose parent, child or fork lineage is not, or whose idempotency key a rule still holds. p_dry_run: counts everything due, changes nothing. Returns (kind, removed) per kind; call again until no kind removes p_batch. Recorded in audit_log when it removed anything. With tenant isolation on, refused (42501) to an operator bound to a tenant: the rules are every tenant''s.';

CREATE OR REPLACE FUNCTION runledger.read_stream(p_run_id text, p_topic text, p_from_offset bigint DEFAULT 0, p_limit integer DEFAULT 1000)
 RETURNS TABLE("offset" bigint, chunk jsonb, seq integer, attempt integer, created_at timestamp with time zone)
 LANGUAGE plpgsql
 STABLE SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
begin
  if p_topic is null or p_topic !~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]*$' or length(p_topic) > 100 then
    raise exception using errcode = 'RL003', message = format('read_stream: invalid topic %L', p_topic);
  end if;
  if p_from_offset is null or p_from_offset < 0 or p_limit is null or p_limit < 1 then
    raise exception using errcode = 'RL003',
      message = format('read_stream: from_offset must be >= 0 and limit >= 1 (got %s, %s)', p_from_offset, p_limit);
  end if;
  if not exists (select 1 from runledger.runs r where r.run_id = p_run_id) then
    raise exception using errcode = 'RL002', message = format('read_stream: run %s not found', p_run_id);
  end if;
  return query
    select c."offset", c.chunk, c.seq, c.attempt, c.created_at
      from runledger.stream_chunks c
     where c.run_id = p_run_id and c.topic = p_topic and c."offset" >= p_from_offset
     order by c."offset"
     limit p_limit;
end;
$function$;
COMMENT ON FUNCTION runledger.read_stream(text,text,bigint,integer) IS 'A run''s durable stream on a topic, for psql: up to p_limit chunks (default 1000) from offset p_from_offset (default 0), in offset order, with the step position and execution attempt that wrote each. Whether it is closed: runledger.streams. RL002 for an unknown run, RL003 for a bad topic or range.';

CREATE OR REPLACE FUNCTION runledger.release_session(p_session_id text)
 RETURNS text
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_next text := runledger._release_session(p_session_id);
begin
  perform runledger._audit('release_session', null, p_session_id,
                           jsonb_build_object('tenant_id', nullif(runledger._session_scope(), '')), to_jsonb(v_next));
  return v_next;
end;
$function$;
COMMENT ON FUNCTION runledger.release_session(text) IS 'Operator repair: takes a session (of the tenant the caller''s session names in runledger.tenant; none: the runs without a tenant) from the run holding it and hands it to the next waiting run; returns that run (null: nobody waited). Recorded in audit_log, with the tenant.';

CREATE OR REPLACE FUNCTION runledger.resolve_operation(p_operation_id text, p_status text, p_result jsonb DEFAULT NULL::jsonb, p_resolved_by text DEFAULT NULL::text)
 RETURNS text
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_status text;
begin
  -- A null status passed the action's check (null not in (...) is null) and broke the
  -- operations row's not-null constraint (23502).
  if p_status is null then
    raise exception using errcode = 'RL003', message = 'resolve_operation: status must be SUCCEEDED or FAILED, not null';
  end if;
  v_status := runledger._resolve_operation(p_operation_id, p_status, p_result, p_resolved_by);
  -- The result is the caller's data: recorded is that one was given, not its content.
  perform runledger._audit('resolve_operation', (select o.run_id from runledger.operations o where o.operation_id = p_operation_id),
                           p_operation_id, jsonb_build_object('status', p_status, 'with_result', p_result is not null),
                           to_jsonb(v_status), p_resolved_by);
  return v_status;
end;
$function$;
COMMENT ON FUNCTION runledger.resolve_operation(text,text,jsonb,text) IS 'Operator action: settles an UNKNOWN operation as SUCCEEDED (with its result) or FAILED, and wakes the run waiting on it. Returns the status set. A status other than SUCCEEDED or FAILED (null included): RL003. Recorded in audit_log.';

CREATE OR REPLACE FUNCTION runledger.resume_rate_limit(p_key text)
 RETURNS runledger.rate_limit_keys
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_limit runledger.rate_limit_keys;
begin
  perform runledger._check_not_tenant_bound('resume_rate_limit');
  update runledger.rate_limit_keys set paused_until = null, pause_reason = null, updated_at = runledger.now()
   where key = p_key returning * into v_limit;
  if not found then
    raise exception using errcode = 'RL002', message = format('resume_rate_limit: no rate limit key %s', coalesce(quote_literal(p_key), 'null'));
  end if;
  perform runledger._wake_rate_limited(p_key);
  perform runledger._audit('resume_rate_limit', null, p_key, null, to_jsonb(v_limit));
  return v_limit;
end;
$function$;
COMMENT ON FUNCTION runledger.resume_rate_limit(text) IS 'Operator action: lifts the key''s pause now (calls go through again within its limit) and wakes the runs waiting on it. RL002 for an unknown key. Recorded in audit_log.';

CREATE OR REPLACE FUNCTION runledger.retry_run(p_run_id text)
 RETURNS text
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_status text := runledger._retry_run(p_run_id);
begin
  perform runledger._audit('retry_run', p_run_id, null, '{}', to_jsonb(v_status));
  return v_status;
end;
$function$;
COMMENT ON FUNCTION runledger.retry_run(text) IS 'Operator action: brings a DEAD_LETTER or FAILED run back to PENDING; its successful checkpoints stay and the failed step runs again. Returns PENDING. Recorded in audit_log.';

CREATE OR REPLACE FUNCTION runledger.run_transitions()
 RETURNS TABLE(from_status runledger.run_status, to_status runledger.run_status, by_whom text)
 LANGUAGE sql
 IMMUTABLE
AS $function$
  values
    ('PENDING'::runledger.run_status, 'RUNNING'::runledger.run_status, 'a claim (_claim_batch, fencing_token + 1), once admitted'),
    ('PENDING', 'CANCELLED', 'cancel_run'),
    ('PENDING', 'CANCELLING', 'cancel_run, or a deadline, with compensations to run'),
    ('PENDING', 'TERMINATED', 'deadline (_enforce_deadlines, or at claim)'),
    ('RUNNING', 'SUCCEEDED', 'the workflow returned (_complete_run)'),
    ('RUNNING', 'FAILED', 'the workflow threw, or its input is invalid (_fail_run)'),
    ('RUNNING', 'TERMINATED', 'deadline, max steps (_terminate_run); budget, no progress (in a checkpoint)'),
    ('RUNNING', 'DEAD_LETTER', 'NON_DETERMINISM, or past max_recovery_attempts'),
    ('RUNNING', 'PENDING', 'lease expired (+1 recovery attempt), or released'),
    ('RUNNING', 'WAITING', 'sleep, signal, approval, child, durable retry backoff, unknown operation'),
    ('RUNNING', 'CANCELLING', 'cancel_run; a policy stop with compensations to run (_terminate_run)'),
    ('WAITING', 'PENDING', 'timer, signal, decision, child ended, resolve_operation (_wake)'),
    ('WAITING', 'RUNNING', 'a claim of a due timer (_claim_batch, queue without limits)'),
    ('WAITING', 'CANCELLED', 'cancel_run'),
    ('WAITING', 'CANCELLING', 'cancel_run, or a deadline, with compensations to run'),
    ('WAITING', 'TERMINATED', 'deadline (_enforce_deadlines, or at claim)'),
    ('CANCELLING', 'CANCELLED', 'the owner (_finish_cancel), or recovery if it died'),
    ('CANCELLING', 'SUCCEEDED', 'the cancel lost the race with the last step (_finish_run)'),
    ('CANCELLING', 'FAILED', 'the cancel lost the race with a failure (_finish_run)'),
    ('CANCELLING', 'TERMINATED', 'the cancel lost the race with a policy stop (_finish_run)'),
    ('CANCELLING', 'DEAD_LETTER', 'the cancel lost the race with a dead-letter (_finish_run)'),
    ('FAILED', 'PENDING', 'retry_run'),
    ('DEAD_LETTER', 'PENDING', 'retry_run'),
    ('FAILED', 'CANCELLING', 'compensate_run'),
    ('CANCELLED', 'CANCELLING', 'compensate_run'),
    ('TERMINATED', 'CANCELLING', 'compensate_run'),
    ('DEAD_LETTER', 'CANCELLING', 'compensate_run')
$function$;
COMMENT ON FUNCTION runledger.run_transitions() IS 'The run state machine: every status change a run may make, and who makes it. The trigger runs_transition refuses any other (docs/state-machine.md draws the same list).';

CREATE OR REPLACE FUNCTION runledger.send_signal(p_run_id text, p_topic text, p_payload jsonb, p_signal_id text DEFAULT NULL::text)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_accepted boolean := runledger._send_signal(p_run_id, p_topic, p_payload, p_signal_id);
begin
  -- The payload is the caller's data: the record names the topic and signal, not what it carried.
  perform runledger._audit('send_signal', p_run_id, p_topic, jsonb_build_object('signal_id', p_signal_id), to_jsonb(v_accepted));
  return v_accepted;
end;
$function$;
COMMENT ON FUNCTION runledger.send_signal(text,text,jsonb,text) IS 'Delivers a signal to a run''s durable inbox; returns false (changing nothing) when signal_id was already accepted. Wakes the run if it waits on this topic; otherwise the signal waits for a later wait. Unknown run: RL002; finished run: RL005. Recorded in audit_log.';

CREATE OR REPLACE FUNCTION runledger.session_history(p_session_id text)
 RETURNS TABLE(seq integer, role text, content jsonb, run_id text, step_position integer, created_at timestamp with time zone)
 LANGUAGE plpgsql
 STABLE SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_tenant text := runledger._session_scope();
begin
  perform runledger._session_check_id(p_session_id);
  if not exists (select 1 from runledger.sessions s where s.session_id = p_session_id and s.tenant_id = v_tenant) then
    raise exception using errcode = 'RL002', message = format('session_history: session %L not found', p_session_id);
  end if;
  return query
    select e.seq, e.role, e.content, e.run_id, e.step_position, e.created_at
      from runledger.session_entries e
     where e.session_id = p_session_id and e.tenant_id = v_tenant
     order by e.seq;
end;
$function$;
COMMENT ON FUNCTION runledger.session_history(text) IS 'A session''s history in order: seq, role, content, and the run and step position that appended each entry. The session is the one of the tenant the caller''s session names (runledger.tenant; none: the runs without a tenant). Unknown session: RL002; invalid id: RL003.';

CREATE OR REPLACE FUNCTION runledger.set_queue(p_name text, p_options jsonb)
 RETURNS runledger.queues
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_queue runledger.queues;
begin
  -- Queues are shared by every tenant (0014_security.sql).
  perform runledger._check_not_tenant_bound('set_queue');
  v_queue := runledger._set_queue(p_name, p_options);
  perform runledger._audit('set_queue', null, p_name, p_options, to_jsonb(v_queue));
  return v_queue;
end;
$function$;
COMMENT ON FUNCTION runledger.set_queue(text,jsonb) IS 'Operator action: creates or changes a queue''s limits (concurrency, per_key_concurrency, rate_limit_max, rate_limit_period_ms) and pause; returns its row. Recorded in audit_log.';

CREATE OR REPLACE FUNCTION runledger.set_rate_limit(p_key text, p_max integer, p_per interval)
 RETURNS runledger.rate_limit_keys
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_limit runledger.rate_limit_keys;
begin
  -- Keys are shared by every tenant, as queues are (0014_security.sql).
  perform runledger._check_not_tenant_bound('set_rate_limit');
  if p_key is null or p_key !~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,99}$' then
    raise exception using errcode = 'RL003',
      message = format('set_rate_limit: key %s is not 1 to 100 characters of [A-Za-z0-9_.:/-] starting with a letter or digit', coalesce(quote_literal(p_key), 'null'));
  end if;
  if (p_max is null) <> (p_per is null) or p_max not between 1 and 1000000 or p_per <= interval '0' or p_per > interval '1 day' then
    raise exception using errcode = 'RL003',
      message = format('set_rate_limit(%s): max must be 1 to 1000000 calls and per an interval above 0 up to 1 day (both null: no limit on calls), not %s per %s',
                       p_key, coalesce(p_max::text, 'null'), coalesce(p_per::text, 'null'));
  end if;
  insert into runledger.rate_limit_keys as k (key, max_calls, per) values (p_key, p_max, p_per)
  on conflict (key) do update set max_calls = excluded.max_calls, per = excluded.per, updated_at = runledger.now()
  returning * into v_limit;
  perform runledger._wake_rate_limited(p_key);
  perform runledger._audit('set_rate_limit', null, p_key, jsonb_build_object('max', p_max, 'per', p_per::text), to_jsonb(v_limit));
  return v_limit;
end;
$function$;
COMMENT ON FUNCTION runledger.set_rate_limit(text,integer,interval) IS 'Operator action: at most p_max calls in any window of length p_per for every step, operation, tool and model call that names the key (rateLimit), across every run and worker; both null: no limit on calls (pauses still apply). Creates or changes the key and wakes the runs waiting on it to ask again. Returns the key''s row. Refused (42501) to an operator bound to a tenant: keys are shared. Recorded in audit_log.';

CREATE OR REPLACE FUNCTION runledger.set_retention(p_kind text, p_keep interval, p_workflow_name text DEFAULT NULL::text)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
begin
  -- The rules apply to every tenant's data (0014_security.sql).
  perform runledger._check_not_tenant_bound('set_retention');
  perform runledger._set_retention(p_kind, p_keep, p_workflow_name);
  perform runledger._audit('set_retention', null, p_kind,
                           jsonb_build_object('keep', coalesce(p_keep::text, 'forever'), 'workflow_name', p_workflow_name), null);
end;
$function$;
COMMENT ON FUNCTION runledger.set_retention(text,interval,text) IS 'Operator action: keep kind (runs, events, idempotency, signals, streams, session_entries, audit_log) for p_keep (null: forever), for workflow p_workflow_name or (null) as the default for workflows without their own rule. Bad kind, negative keep, or a workflow for session_entries or audit_log: RL003. An audit_log rule shorter than owner_settings.audit_log_min_keep (365 days unless the schema''s owner lowered it): 42501. With tenant isolation on, refused (42501) to an operator bound to a tenant. Recorded in audit_log, and that record is never pruned.';

CREATE OR REPLACE FUNCTION runledger.set_session_budget(p_session_id text, p_budget jsonb)
 RETURNS runledger.sessions
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_session runledger.sessions := runledger._set_session_budget(p_session_id, p_budget);
begin
  perform runledger._audit('set_session_budget', v_session.holder_run_id, p_session_id,
                           jsonb_build_object('budget', p_budget, 'tenant_id', nullif(v_session.tenant_id, '')),
                           jsonb_build_object('budget_limits', v_session.budget_limits, 'budget_used', v_session.budget_used));
  return v_session;
end;
$function$;
COMMENT ON FUNCTION runledger.set_session_budget(text,jsonb) IS 'Operator action: the budget of a session (of the tenant the caller''s session names; none: the runs without a tenant) across every run that holds it, an object of dimensions ({"tokens": 1000000, "cost_usd": 20}); null removes it. What was spent stays counted; a run holding the session is held to the new remainder at once. Creates the session if it does not exist. Bad budget: RL003. Recorded in audit_log.';

CREATE OR REPLACE FUNCTION runledger.start_run(p_workflow text, p_input jsonb, p_options jsonb DEFAULT '{}'::jsonb)
 RETURNS text
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
begin
  if p_options ? 'debounce' then
    return runledger._start_debounced(p_workflow, p_input, p_options);
  end if;
  return (runledger._start(p_workflow, p_input, p_options)).run.run_id;
end;
$function$;
COMMENT ON FUNCTION runledger.start_run(text,jsonb,jsonb) IS 'Starts a run of a registered workflow and dispatches it (or leaves it to its queue''s admission); returns run_id. Options: run_at (delayed start at a timestamp, compared with runledger.now()) or run_in_ms (delayed start this many ms after now on the database clock), run_id, idempotency_key (same key or run_id returns the existing run), queue, priority, concurrency_key, version, max_recovery_attempts, limits overriding the workflow''s: deadline (interval or timestamp), max_steps, budget, no_progress; traceparent (a W3C traceparent the run''s executions are traced under, see runs.traceparent); notify (default true): false starts an immediately runnable run without waking the queue''s workers by NOTIFY, for a caller whose own worker claims it (engine.start does so when its process''s worker has a free slot; other workers find the run at their next poll); and debounce {key, delay_ms, max_wait_ms}: starts of the workflow with the same key collapse into one run that starts delay_ms after the last of them (no later than max_wait_ms after the first, when given), with its input (_start_debounced). An unknown option is RL003 (naming it and the known ones), as are run_at or a deadline that is not a finite time PostgreSQL holds (infinity, -infinity, unparsable text) and run_in_ms outside 0 to 2^53 - 1.';

CREATE OR REPLACE FUNCTION runledger.start_runs(p_workflow text, p_inputs jsonb, p_options jsonb DEFAULT '{}'::jsonb)
 RETURNS text[]
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET search_path TO 'pg_catalog', 'runledger', 'pg_temp'
AS $function$
declare
  v_t      runledger.runs;
  v_opts   jsonb := coalesce(p_options, '{}');
  v_n      int;
  v_ids    text[];
  v_keys   text[];
  v_inserted text[];
  v_new    int;
  v_bad    record;
  v_key    text;
  v_created jsonb;
  -- Ids made here are ULIDs that sort in input order: this statement's milliseconds (10
  -- characters) and 35 random bits (7), both drawn once, then the input's position as 9
  -- decimal digits (Crockford base32 characters too; a jsonb array holds at most 2^28 - 1
  -- elements, fewer than 10^9). Per row that is one lpad, not 80 bits encoded. Two statements in the same
  -- millisecond collide only if their 35 random bits do, and then the second fails on the
  -- primary key (23505) rather than taking the first one's runs for its own.
  v_id_prefix text := runledger._base32_10((extract(epoch from clock_timestamp()) * 1000)::bigint)
                      || right(runledger._base32_10(runledger._random_40()), 7);
begin
  if p_inputs is null or jsonb_typeof(p_inputs) <> 'array' then
    raise exception using errcode = 'RL003', message = 'start_runs: inputs must be a JSON array (one input per run)';
  end if;
  v_n := jsonb_array_length(p_inputs);
  if v_opts ? 'run_id' or v_opts ? 'idempotency_key' then
    raise exception using errcode = 'RL003',
      message = 'start_runs: give run_ids and idempotency_keys as arrays, one per input (run_id and idempotency_key are start_run''s)';
  end if;
  foreach v_key in array array['run_ids', 'idempotency_keys', 'concurrency_keys'] loop
    if v_opts ? v_key and (jsonb_typeof(v_opts->v_key) <> 'array' or jsonb_array_length(v_opts->v_key) <> v_n) then
      raise exception using errcode = 'RL003', message = format('start_runs: %s must be an array of %s entries (one per input, null for none)', v_key, v_n);
    end if;
  end loop;
  select e.ordinality - 1 as i, e.value as id into v_bad
    from jsonb_array_elements(coalesce(v_opts->'run_ids', '[]')) with ordinality e
   where jsonb_typeof(e.value) <> 'null'
     and (jsonb_typeof(e.value) <> 'string' or e.value #>> '{}' !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]*$'
          or length(e.value #>> '{}') > 200)
   limit 1;
  if found then
    raise exception using errcode = 'RL003', message = format('start_runs: invalid run id %s (input %s)', v_bad.id, v_bad.i);
  end if;
  select e.ordinality - 1 as i, pg_column_size(e.value) as bytes into v_bad
    from jsonb_array_elements(p_inputs) with ordinality e
   where pg_column_size(e.value) > runledger._max_payload_bytes()
   limit 1;
  if found then
    raise exception using errcode = 'RL004',
      message = format('start_runs: input %s is %s bytes, over the limit of %s', v_bad.i, v_bad.bytes, runledger._max_payload_bytes());
  end if;
  v_t := runledger._start_template(p_workflow, v_opts - 'run_ids' - 'idempotency_keys' - 'concurrency_keys', 'start_runs');
  if v_n = 0 then
    return '{}';
  end if;
  -- Every created event says the same: built once, not per row.
  v_created := jsonb_build_object('workflow', p_workflow, 'version', v_t.workflow_version, 'queue', v_t.queue_name);

  -- Each input's run id (given, else made here) and key, in input order. ROWS FROM reads
  -- the arrays side by side in one pass (an absent one gives nulls); a function scan
  -- returns its rows in order, so the arrays are in input order without a sort.
  select array_agg(coalesce(e.run_id, v_id_prefix || lpad((e.i - 1)::text, 9, '0'))), array_agg(e.idempotency_key)
    into v_ids, v_keys
    from rows from (generate_series(1, v_n), jsonb_array_elements_text(v_opts->'run_ids'),
                    jsonb_array_elements_text(v_opts->'idempotency_keys')) e(i, run_id, idempotency_key);

  if not (v_opts ? 'run_ids' or v_opts ? 'idempotency_keys') then
    -- New runs only: no input names an existing run, so a plain INSERT (ON CONFLICT would
    -- look each row up in every unique index first). The rows and their created events.
    with inserted as (
      insert into runledger.runs (
        run_id, workflow_name, workflow_version, queue_name, input, admitted, not_before, priority, concurrency_key,
        tenant_id, deadline_at, max_recovery_attempts, version_manifest, max_steps, budget, no_progress,
        retry_budget, policy_version, traceparent, created_at, updated_at)
      select e.run_id, v_t.workflow_name, v_t.workflow_version, v_t.queue_name, e.input, v_t.admitted, v_t.not_before,
             v_t.priority, coalesce(e.concurrency_key, v_t.concurrency_key), v_t.tenant_id, v_t.deadline_at,
             v_t.max_recovery_attempts, v_t.version_manifest, v_t.max_steps, v_t.budget, v_t.no_progress, v_t.retry_budget,
             v_t.policy_version, v_t.traceparent, v_t.created_at, v_t.updated_at
        from rows from (unnest(v_ids), jsonb_array_elements(p_inputs),
                        jsonb_array_elements_text(v_opts->'concurrency_keys')) e(run_id, input, concurrency_key)
      returning run_id
    )
    insert into runledger.events (run_id, kind, detail, at)
    select n.run_id, 'created', v_created, v_t.created_at
      from inserted n;
    v_new := v_n;
  else
    -- One statement: the rows, and the created events of those that are new. A given id or
    -- idempotency key that already has a run (also one given twice in this call) is kept
    -- out by ON CONFLICT and resolved below.
    with inserted as (
      insert into runledger.runs (
        run_id, workflow_name, workflow_version, queue_name, input, admitted, not_before, priority, concurrency_key,
        idempotency_key, tenant_id, deadline_at, max_recovery_attempts, version_manifest, max_steps, budget, no_progress,
        retry_budget, policy_version, traceparent, created_at, updated_at)
      select e.run_id, v_t.workflow_name, v_t.workflow_version, v_t.queue_name, e.input, v_t.admitted, v_t.not_before,
             v_t.priority, coalesce(e.concurrency_key, v_t.concurrency_key), e.idempotency_key, v_t.tenant_id,
             v_t.deadline_at, v_t.max_recovery_attempts, v_t.version_manifest, v_t.max_steps, v_t.budget, v_t.no_progress,
             v_t.retry_budget, v_t.policy_version, v_t.traceparent, v_t.created_at, v_t.updated_at
        from rows from (unnest(v_ids), jsonb_array_elements(p_inputs), unnest(v_keys),
                        jsonb_array_elements_text(v_opts->'concurrency_keys')) e(run_id, input, idempotency_key, concurrency_key)
      on conflict do nothing
      returning run_id
    ), logged as (
      insert into runledger.events (run_id, kind, detail, at)
      select n.run_id, 'created', v_created, v_t.created_at
        from inserted n
    )
    select array_agg(n.run_id) into v_inserted from inserted n;
    v_new := coalesce(cardinality(v_inserted), 0);
  end if;

  if v_new < v_n then
    -- Idempotent start, per input: the same run_id or idempotency key gives the existing
    -- run (read in a statement of its own, so a run another transaction just committed is seen).
    select u.i - 1 as i, r.run_id, r.workflow_name into v_bad
      from unnest(v_ids) with ordinality u(run_id, i)
      join runledger.runs r on r.run_id = u.run_id
     where not (u.run_id = any(coalesce(v_inserted, '{}'))) and r.workflow_name <> p_workflow
     limit 1;
    if found then
      raise exception using errcode = 'RL005',
        message = format('start_runs: run_id %L (input %s) already belongs to workflow %L', v_bad.run_id, v_bad.i, v_bad.workflow_name);
    end if;
    select array_agg(coalesce(
             (select r.run_id from runledger.runs r where r.run_id = u.run_id and r.workflow_name = p_workflow),
             (select r.run_id from runledger.runs r
               where u.key is not null and r.workflow_name = p_workflow and r.idempotency_key = u.key)) order by u.i)
      into v_ids
      from unnest(v_ids, v_keys) with ordinality u(run_id, key, i);
  end if;

  if v_new > 0 then
    if not v_t.admitted then
      perform runledger._admit(v_t.queue_name);
    elsif v_t.not_before is not null or coalesce((v_opts->>'notify')::boolean, true) then
      -- One announcement for all of them (_dispatch's NOTIFY names the queue, not the run).
      perform runledger._dispatch(null, v_t.queue_name,
        coalesce(greatest(0, ceil(extract(epoch from v_t.not_before - v_t.created_at) * 1000))::bigint, 0));
    end if;
  end if;
  return v_ids;
end;
$function$;
COMMENT ON FUNCTION runledger.start_runs(text,jsonb,jsonb) IS 'Starts one run of a registered workflow per element of the JSON array p_inputs, in one statement, and announces its queue once; returns the run ids in input order. Options as start_run''s (an unknown one is RL003), for every run, except run_ids, idempotency_keys and concurrency_keys: arrays with one entry per input (null for none). An input whose run_id or idempotency key already has a run gives that run''s id (idempotent, per input); a run_id of another workflow is RL005. Without run_ids and idempotency_keys every run is new and gets an id made here (a ULID, in input order).';

CREATE OR REPLACE FUNCTION runledger.step_kinds()
 RETURNS text[]
 LANGUAGE sql
 IMMUTABLE
AS $function$
  select array['step', 'transaction', 'operation', 'sleep', 'signal', 'approval', 'child_start', 'child']
$function$;
COMMENT ON FUNCTION runledger.step_kinds() IS 'What a checkpoint records (steps.kind): one per ctx call that takes a step position.';

CREATE OR REPLACE FUNCTION runledger.termination_reasons()
 RETURNS text[]
 LANGUAGE sql
 IMMUTABLE
AS $function$
  select array['COMPLETED', 'FAILED', 'CANCELLED', 'DEADLINE', 'MAX_STEPS', 'BUDGET', 'NO_PROGRESS',
               'MAX_RECOVERY_ATTEMPTS', 'NON_DETERMINISM', 'UNVERIFIED', 'POLICY']
$function$;
COMMENT ON FUNCTION runledger.termination_reasons() IS 'Why a terminal run stopped (runs.termination_reason); see docs/termination.md for the evidence of each.';

CREATE OR REPLACE FUNCTION runledger.wait_kinds()
 RETURNS text[]
 LANGUAGE sql
 IMMUTABLE
AS $function$
  select array['timer', 'signal', 'approval', 'child', 'retry', 'reconcile', 'rate_limit']
$function$;
COMMENT ON FUNCTION runledger.wait_kinds() IS 'What a WAITING run waits for (runs.wait_kind); see docs/state-machine.md.';
