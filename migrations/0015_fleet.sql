-- The live replicas of a fleet (issue 44): BigQuery's per-user and per-project quotas are shared
-- by every replica, so each paces its share, the quota divided by the replicas alive here. A
-- replica renews its row with its execution leases and deletes it when it shuts down; a row
-- whose lease lapsed is a lost replica, and no longer counts.
CREATE TABLE fleet_replicas (
    replica_id TEXT PRIMARY KEY,
    expires_at TIMESTAMPTZ NOT NULL
);
