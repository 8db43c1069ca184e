-- bspweb supernode schema, version 9: two-level placement (issue 15,
-- dissertation Fig. 6.1). The cluster a process's block was placed in
-- (the effective cluster of its peer then: the volunteer's --cluster, else
-- the one found on the measured links); NULL: placed without clusters.
-- Restores and migrations keep a process inside it while it has peers.
ALTER TABLE placements ADD COLUMN cluster TEXT;
