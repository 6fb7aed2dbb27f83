-- A grant to fetch one firmware image from shepherd's image server, made
-- for one update through a BMC that fetches its image itself (Redfish's
-- SimpleUpdate, with the grant's ID as its Username and the secret as its
-- Password). Only the secret's SHA-256 is kept. Not a contract table:
-- shepherd's own.
CREATE TABLE firmware_grant (
    grant_id uuid PRIMARY KEY,
    machine_id uuid NOT NULL REFERENCES machines (machine_id) ON DELETE CASCADE,
    -- The file under installations.images_dir it lets the BMC fetch.
    image text NOT NULL,
    secret_sha256 bytea NOT NULL,
    issued_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL,
    -- When the BMC last fetched it (NULL: never).
    fetched_at timestamptz NULL
);
CREATE INDEX firmware_grant_expires ON firmware_grant (expires_at);
