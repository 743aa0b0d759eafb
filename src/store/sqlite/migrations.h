#pragma once

#include <array>

// The SQLite schema as an ordered list of steps. A database records the last
// step applied in PRAGMA user_version (0 for a new file); opening it applies
// the steps after that, each in its own transaction, and refuses a database
// whose version is above kSchemaVersion (written by a newer moatd).
//
// Steps are append-only: never edit one that has shipped, add the next.
namespace moat::store::sqlite {

struct Migration {
  int version;      // user_version once this step is applied: 1, 2, ...
  const char* sql;  // one or more statements, no values from outside
};

inline constexpr std::array kMigrations = {
    Migration{1, R"sql(
CREATE TABLE environments (
  id            TEXT PRIMARY KEY NOT NULL,
  task_id       TEXT NOT NULL DEFAULT '',
  template      TEXT NOT NULL DEFAULT '',
  cpus          REAL NOT NULL DEFAULT 0,
  ram_mb        INTEGER NOT NULL DEFAULT 0,
  storage_gb    REAL NOT NULL DEFAULT 0,
  pids          INTEGER NOT NULL DEFAULT 0,
  labels        TEXT NOT NULL DEFAULT '{}',  -- JSON object of string values
  state         TEXT NOT NULL
                CHECK (state IN ('creating', 'running', 'destroying', 'gone', 'failed')),
  reason        TEXT NOT NULL DEFAULT '',
  created_at_ms INTEGER NOT NULL DEFAULT 0,
  expires_at_ms INTEGER NOT NULL DEFAULT 0,
  owner         TEXT NOT NULL DEFAULT ''
);
CREATE INDEX environments_state ON environments (state);
CREATE INDEX environments_task_id ON environments (task_id);
CREATE INDEX environments_owner ON environments (owner);
)sql"},
    Migration{2, R"sql(
ALTER TABLE environments ADD COLUMN env TEXT NOT NULL DEFAULT '{}';  -- JSON object
CREATE TABLE api_keys (
  id             TEXT PRIMARY KEY NOT NULL,
  name           TEXT NOT NULL DEFAULT '',
  token_hash     TEXT NOT NULL,
  scopes         TEXT NOT NULL DEFAULT '[]',  -- JSON array of scope names
  created_at_ms  INTEGER NOT NULL DEFAULT 0,
  revoked_at_ms  INTEGER NOT NULL DEFAULT 0
);
)sql"},
    Migration{3, R"sql(
ALTER TABLE environments ADD COLUMN permissions TEXT NOT NULL DEFAULT '';  -- JSON array of layers; '' = defaults
ALTER TABLE api_keys ADD COLUMN permissions TEXT NOT NULL DEFAULT '';      -- JSON ceiling; '' = none
CREATE TABLE approvals (
  id             TEXT PRIMARY KEY NOT NULL,
  environment    TEXT NOT NULL,
  scope          TEXT NOT NULL,
  action         TEXT NOT NULL,                -- JSON: what would happen
  requester      TEXT NOT NULL,                -- "master" or an API key id
  created_at_ms  INTEGER NOT NULL,
  state          TEXT NOT NULL CHECK (state IN ('pending', 'approved', 'denied', 'expired')),
  decided_by     TEXT NOT NULL DEFAULT '',
  reason         TEXT NOT NULL DEFAULT '',
  decided_at_ms  INTEGER NOT NULL DEFAULT 0,
  remember       INTEGER NOT NULL DEFAULT 0,
  used           INTEGER NOT NULL DEFAULT 0    -- an approval granted to a later, repeated request
);
CREATE INDEX approvals_state ON approvals (state);
CREATE INDEX approvals_environment ON approvals (environment);
)sql"},
    // The audit log (src/audit/). Ids are assigned by moatd, consecutive in
    // append order; the trigger keeps moatd's own code from editing a row
    // (pruning deletes whole prefixes, see audit::Log). No index on time:
    // times grow with the ids, and every index is another page written per
    // batch.
    Migration{4, R"sql(
CREATE TABLE events (
  id           INTEGER PRIMARY KEY NOT NULL,
  time_ms      INTEGER NOT NULL,
  type         TEXT NOT NULL,
  environment  TEXT NOT NULL DEFAULT '',
  actor        TEXT NOT NULL DEFAULT '',
  data         TEXT NOT NULL DEFAULT '{}',  -- canonical JSON
  prev_hash    TEXT NOT NULL,
  hash         TEXT NOT NULL
);
CREATE INDEX events_environment ON events (environment, id);
CREATE TRIGGER events_append_only BEFORE UPDATE ON events
BEGIN
  SELECT RAISE(ABORT, 'audit events are append-only');
END;
)sql"},
    // Egress (src/egress/): the network policy as given (JSON, "" = none),
    // the secrets with their placeholders (JSON; the state directory is
    // private to moatd) and the slot of the environment's link (-1: none).
    Migration{5, R"sql(
ALTER TABLE environments ADD COLUMN network TEXT NOT NULL DEFAULT '';
ALTER TABLE environments ADD COLUMN secrets TEXT NOT NULL DEFAULT '';
ALTER TABLE environments ADD COLUMN net_slot INTEGER NOT NULL DEFAULT -1;
)sql"},
    // Snapshots of environments' writable layers (btrfs snapshots in the
    // storage pool): who owns each, what it was taken of and the host uid
    // its files' root had (to re-own them in a fork). "creating" until the
    // snapshot exists: a restart finds those and rolls them back.
    Migration{6, R"sql(
CREATE TABLE snapshots (
  id             TEXT PRIMARY KEY NOT NULL,
  environment    TEXT NOT NULL,
  owner          TEXT NOT NULL,
  template       TEXT NOT NULL,
  storage_gb     REAL NOT NULL,
  host_base      INTEGER NOT NULL DEFAULT 0,
  name           TEXT NOT NULL DEFAULT '',
  state          TEXT NOT NULL,
  created_at_ms  INTEGER NOT NULL
);
CREATE INDEX snapshots_owner ON snapshots (owner, created_at_ms);
)sql"},
    // Named templates (src/templates/): root file systems moatd keeps under
    // its state directory, made from OCI images or recipes; `config` holds
    // the image's defaults as JSON. A restart fails those still importing.
    Migration{7, R"sql(
CREATE TABLE templates (
  name           TEXT PRIMARY KEY NOT NULL,
  source         TEXT NOT NULL,
  state          TEXT NOT NULL,
  error_code     TEXT NOT NULL DEFAULT '',
  error_message  TEXT NOT NULL DEFAULT '',
  config         TEXT NOT NULL DEFAULT '{}',
  size_bytes     INTEGER NOT NULL DEFAULT 0,
  owner          TEXT NOT NULL,
  created_at_ms  INTEGER NOT NULL
);
)sql"},
    // What bounds each environment (docs/MICROVM.md): the namespace backend
    // or a microVM, and the microVM's accelerator once it runs.
    Migration{8, R"sql(
ALTER TABLE environments ADD COLUMN isolation TEXT NOT NULL DEFAULT 'namespaces';
ALTER TABLE environments ADD COLUMN accel TEXT NOT NULL DEFAULT '';
)sql"},
    // A snapshot holds a namespace environment's files (a writable layer)
    // or a microVM's disk: what an environment made from it is.
    Migration{9, R"sql(
ALTER TABLE snapshots ADD COLUMN isolation TEXT NOT NULL DEFAULT 'namespaces';
)sql"},
    // Pauses (docs/PAUSE.md): the state `paused`, when the pause that holds
    // an environment began, and whether its time to live goes on meanwhile.
    // SQLite cannot change a CHECK in place: the table is made again.
    Migration{10, R"sql(
CREATE TABLE environments_new (
  id               TEXT PRIMARY KEY NOT NULL,
  task_id          TEXT NOT NULL DEFAULT '',
  template         TEXT NOT NULL DEFAULT '',
  cpus             REAL NOT NULL DEFAULT 0,
  ram_mb           INTEGER NOT NULL DEFAULT 0,
  storage_gb       REAL NOT NULL DEFAULT 0,
  pids             INTEGER NOT NULL DEFAULT 0,
  labels           TEXT NOT NULL DEFAULT '{}',
  state            TEXT NOT NULL
                   CHECK (state IN ('creating', 'running', 'paused', 'destroying', 'gone', 'failed')),
  reason           TEXT NOT NULL DEFAULT '',
  created_at_ms    INTEGER NOT NULL DEFAULT 0,
  expires_at_ms    INTEGER NOT NULL DEFAULT 0,
  owner            TEXT NOT NULL DEFAULT '',
  env              TEXT NOT NULL DEFAULT '{}',
  permissions      TEXT NOT NULL DEFAULT '',
  network          TEXT NOT NULL DEFAULT '',
  secrets          TEXT NOT NULL DEFAULT '',
  net_slot         INTEGER NOT NULL DEFAULT -1,
  isolation        TEXT NOT NULL DEFAULT 'namespaces',
  accel            TEXT NOT NULL DEFAULT '',
  paused_at_ms     INTEGER NOT NULL DEFAULT 0,
  ttl_while_paused TEXT NOT NULL DEFAULT 'stops' CHECK (ttl_while_paused IN ('stops', 'runs'))
);
INSERT INTO environments_new (id, task_id, template, cpus, ram_mb, storage_gb, pids, labels, state, reason,
  created_at_ms, expires_at_ms, owner, env, permissions, network, secrets, net_slot, isolation, accel)
SELECT id, task_id, template, cpus, ram_mb, storage_gb, pids, labels, state, reason,
  created_at_ms, expires_at_ms, owner, env, permissions, network, secrets, net_slot, isolation, accel
FROM environments;
DROP TABLE environments;
ALTER TABLE environments_new RENAME TO environments;
CREATE INDEX environments_state ON environments (state);
CREATE INDEX environments_task_id ON environments (task_id);
CREATE INDEX environments_owner ON environments (owner);
)sql"},
    // What the time to live does when it runs out (docs/PAUSE.md, "At
    // expiry"), and the time to live given last, which a resume after a
    // pause at expiry gives again.
    Migration{11, R"sql(
ALTER TABLE environments ADD COLUMN on_expiry TEXT NOT NULL DEFAULT 'destroy'
  CHECK (on_expiry IN ('destroy', 'pause'));
ALTER TABLE environments ADD COLUMN ttl_s INTEGER NOT NULL DEFAULT 0;
)sql"},
    // Where a paused environment's memory is: in RAM, or on disk (a
    // checkpoint: docs/PAUSE.md, "To disk"); and where a pause at expiry
    // puts it (on_expiry "checkpoint" is stored as 'pause' with 'disk').
    Migration{12, R"sql(
ALTER TABLE environments ADD COLUMN paused_memory TEXT NOT NULL DEFAULT 'ram'
  CHECK (paused_memory IN ('ram', 'disk'));
ALTER TABLE environments ADD COLUMN expiry_memory TEXT NOT NULL DEFAULT 'ram'
  CHECK (expiry_memory IN ('ram', 'disk'));
)sql"},
    // A checkpoint a file read brought back into RAM, paused, which goes
    // back to disk once no read came for a while (docs/PAUSE.md, "To disk").
    Migration{13, R"sql(
ALTER TABLE environments ADD COLUMN back_to_disk INTEGER NOT NULL DEFAULT 0 CHECK (back_to_disk IN (0, 1));
)sql"},
};

inline constexpr int kSchemaVersion = kMigrations.back().version;

// The steps must be numbered 1..N in order for the version arithmetic above.
constexpr bool migrationsAreNumberedInOrder() {
  for (size_t i = 0; i < kMigrations.size(); ++i) {
    if (kMigrations[i].version != static_cast<int>(i) + 1) return false;
  }
  return true;
}
static_assert(migrationsAreNumberedInOrder(), "kMigrations must be numbered 1, 2, 3, ...");

}  // namespace moat::store::sqlite
