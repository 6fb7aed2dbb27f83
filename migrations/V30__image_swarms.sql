-- The machines installing one served image that fetch its chunks from
-- each other (src/images/swarm.rs): a machine's agent joins when its
-- installation starts and again every few seconds while it serves; a
-- row not touched for a while is no longer a member (its agent stopped,
-- its machine rebooted). The image server names each member the members
-- that joined before it, in a tree, so the server's link carries the
-- image about once.
CREATE TABLE image_swarm_member (
    machine_id uuid PRIMARY KEY REFERENCES machines (machine_id) ON DELETE CASCADE,
    image text NOT NULL,
    -- Where its chunk server is: the address its join came from, and the
    -- port it named.
    address text NOT NULL,
    joined_at timestamptz NOT NULL DEFAULT now(),
    seen_at timestamptz NOT NULL DEFAULT now(),
    -- It left (its fetch done, no member asking): no longer listed, but
    -- known to have joined since its installation was asked (whom the
    -- others still wait for is who has not).
    left_at timestamptz NULL
);
CREATE INDEX image_swarm_member_image ON image_swarm_member (image, joined_at);
