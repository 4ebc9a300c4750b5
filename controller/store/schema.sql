-- gpufleet controller store, schema version 1 (PRAGMA user_version).
CREATE TABLE IF NOT EXISTS nodes (
    name        TEXT PRIMARY KEY,
    hello       BLOB NOT NULL,          -- gpufleet.v1.Hello: inventory and host facts
    first_seen  REAL NOT NULL,
    last_seen   REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS boots (
    node        TEXT NOT NULL,
    boot_id     TEXT NOT NULL,
    acked_seq   INTEGER NOT NULL,       -- highest contiguous frame stored
    updated     REAL NOT NULL,
    PRIMARY KEY (node, boot_id)
);
CREATE TABLE IF NOT EXISTS gpu_state (
    node        TEXT NOT NULL,
    gpu         INTEGER NOT NULL,
    time        REAL NOT NULL,
    sample      BLOB NOT NULL,          -- gpufleet.v1.GpuSample, sanitized
    held        TEXT NOT NULL,          -- JSON: condition -> since
    PRIMARY KEY (node, gpu)
);
CREATE TABLE IF NOT EXISTS host_state (
    node        TEXT PRIMARY KEY,
    time        REAL NOT NULL,
    sample      BLOB NOT NULL           -- gpufleet.v1.HostSample
);
CREATE TABLE IF NOT EXISTS bmc_state (   -- added within version 1: IF NOT EXISTS creates it in older files
    node        TEXT PRIMARY KEY,
    time        REAL NOT NULL,          -- the poll's start (unix seconds)
    sample      BLOB NOT NULL           -- gpufleet.v1.BmcSample, sanitized
);
CREATE TABLE IF NOT EXISTS probe_results (
    node        TEXT NOT NULL,
    gpu         INTEGER NOT NULL,       -- -1: node-level
    probe       TEXT NOT NULL,
    variant     TEXT NOT NULL,
    time        REAL NOT NULL,
    value       REAL NOT NULL,
    unit        TEXT NOT NULL,
    result      BLOB NOT NULL,          -- gpufleet.v1.ProbeResult
    PRIMARY KEY (node, gpu, probe, variant)
);
CREATE TABLE IF NOT EXISTS probe_history ( -- not written since probe_series: read once to fill it, then pruned
    node        TEXT NOT NULL,
    gpu         INTEGER NOT NULL,
    probe       TEXT NOT NULL,
    variant     TEXT NOT NULL,
    time        REAL NOT NULL,
    value       REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS probe_history_by_key ON probe_history (node, gpu, probe, variant, time);
CREATE TABLE IF NOT EXISTS findings (
    id          TEXT PRIMARY KEY,
    node        TEXT NOT NULL,
    gpu         INTEGER,                -- NULL: node-level
    cause       TEXT NOT NULL,
    severity    TEXT NOT NULL,
    first_seen  REAL NOT NULL,
    last_seen   REAL NOT NULL,
    active      INTEGER NOT NULL,
    body        BLOB NOT NULL           -- JSON of the finding with its evidence
);
CREATE INDEX IF NOT EXISTS findings_active ON findings (active, node);
CREATE TABLE IF NOT EXISTS commands (     -- added within version 1: IF NOT EXISTS creates it in older files
    id          TEXT PRIMARY KEY,
    node        TEXT NOT NULL,
    kind        TEXT NOT NULL,          -- the Command's action: run_probes, ...
    requester   TEXT NOT NULL,          -- scheduler, on_connect, operator:<peer>
    state       TEXT NOT NULL,          -- pending sent running succeeded failed timed_out cancelled
    created     REAL NOT NULL,
    sent        REAL,                   -- NULL: never sent
    finished    REAL,                   -- NULL: not finished
    deadline    REAL NOT NULL,
    boot_id     TEXT NOT NULL,          -- the agent boot it was sent to ('' while pending)
    error       TEXT NOT NULL,
    command     BLOB NOT NULL,          -- gpufleet.v1.Command
    result      BLOB                    -- gpufleet.v1.CommandResult, when the agent answered
);
CREATE INDEX IF NOT EXISTS commands_by_node ON commands (node, created);
CREATE INDEX IF NOT EXISTS commands_open ON commands (finished);
CREATE TABLE IF NOT EXISTS audit (        -- added within version 1: IF NOT EXISTS creates it in older files
    id          TEXT PRIMARY KEY,
    time        REAL NOT NULL,          -- when it was requested (written before acting)
    requester   TEXT NOT NULL,          -- operator:<peer>, policy, scheduler
    action      TEXT NOT NULL,          -- probe_node, breaker_reset, retune, drain, ...
    node        TEXT NOT NULL,          -- '' when it names no node
    parameters  TEXT NOT NULL,          -- JSON object
    reason      TEXT NOT NULL,
    findings    TEXT NOT NULL,          -- JSON list of finding ids
    outcome     TEXT NOT NULL,          -- requested, then allowed refused succeeded failed rolled_back
    outcome_time REAL,                  -- NULL while requested
    detail      TEXT NOT NULL           -- why refused, the error, the command id
);
CREATE INDEX IF NOT EXISTS audit_by_time ON audit (time);
CREATE INDEX IF NOT EXISTS audit_by_node ON audit (node, time);
CREATE TABLE IF NOT EXISTS breaker (      -- one row: the blast-radius breaker (controller/remediate/)
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    state       TEXT NOT NULL,          -- JSON: window actions, tripped, why, tripped_at
    updated     REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS recommendations (  -- added within version 1: IF NOT EXISTS creates it in older files
    id          TEXT PRIMARY KEY,
    node        TEXT NOT NULL,
    cause       TEXT NOT NULL,          -- the finding cause it answers ('' for an operator's retune)
    profile     TEXT NOT NULL,          -- '' for drain / investigate
    state       TEXT NOT NULL,          -- proposed approved applying verified rolled_back failed needs_attention
    created     REAL NOT NULL,
    updated     REAL NOT NULL,
    command_id  TEXT NOT NULL,          -- the ApplyProfile command ('' before applying)
    body        TEXT NOT NULL,          -- JSON: action, policy, risk, findings, gpus, changes, targets, ...
    result      BLOB                    -- gpufleet.v1.ApplyProfileResult, once the agent answered
);
CREATE INDEX IF NOT EXISTS recommendations_by_node ON recommendations (node, created);
CREATE TABLE IF NOT EXISTS drains (       -- added within version 1: IF NOT EXISTS creates it in older files
    id          TEXT PRIMARY KEY,
    node        TEXT NOT NULL,
    state       TEXT NOT NULL,          -- running, then drained blocked timed_out failed
    started     REAL NOT NULL,
    updated     REAL NOT NULL,
    body        BLOB NOT NULL           -- JSON: pods pending (PDB backoff), evicted, skipped, the deadline, breaker action
);
CREATE INDEX IF NOT EXISTS drains_by_node ON drains (node, started);
CREATE TABLE IF NOT EXISTS silences (     -- added within version 1: IF NOT EXISTS creates it in older files
    id          TEXT PRIMARY KEY,
    node        TEXT NOT NULL,
    cause       TEXT NOT NULL,          -- a cause name, '' for every cause
    starts      REAL NOT NULL,
    ends        REAL NOT NULL,          -- moved back to the time of an unsilence that ended it early
    requester   TEXT NOT NULL,          -- who silenced, as the audit log names the caller
    comment     TEXT NOT NULL,
    ended_by    TEXT NOT NULL,          -- who unsilenced it ('' while it runs its course)
    end_comment TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS silences_by_end ON silences (ends);
CREATE TABLE IF NOT EXISTS maintenance (  -- added within version 1: nodes under maintenance (one row each)
    node        TEXT PRIMARY KEY,
    requester   TEXT NOT NULL,
    comment     TEXT NOT NULL,
    since       REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS finding_acks ( -- added within version 1: an operator's newest ack of each finding
    finding_id  TEXT PRIMARY KEY,
    node        TEXT NOT NULL,
    requester   TEXT NOT NULL,          -- who acked, as the audit log names the caller
    comment     TEXT NOT NULL,
    time        REAL NOT NULL
)
;
CREATE TABLE IF NOT EXISTS leader (       -- added within version 1: the leading controller's term (lease.py)
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    epoch       INTEGER NOT NULL,       -- the term: one more with every new lead
    holder      TEXT NOT NULL,          -- host:pid of the controller that took it
    since       REAL NOT NULL
)
;
CREATE TABLE IF NOT EXISTS node_owners (  -- added within version 1: the replica that ingests each node (owners.py)
    node        TEXT PRIMARY KEY,
    holder      TEXT NOT NULL,          -- host:pid of the replica holding the node's stream
    since       REAL NOT NULL,          -- when that replica took the node (its clock)
    written     REAL NOT NULL           -- when it last wrote the node's rows (its clock)
);
CREATE INDEX IF NOT EXISTS node_owners_written ON node_owners (written)
;
CREATE TABLE IF NOT EXISTS probe_series ( -- added within version 1: each probe key's newest results, one row a key
    node        TEXT NOT NULL,
    gpu         INTEGER NOT NULL,       -- -1: node-level
    probe       TEXT NOT NULL,
    variant     TEXT NOT NULL,
    points      BLOB NOT NULL,          -- (time, value) pairs oldest first, little-endian doubles (fleet/series.py)
    PRIMARY KEY (node, gpu, probe, variant)
)
