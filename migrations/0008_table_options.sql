-- The table layout a resource declares (`table_options` on PUT resource, in its declared JSON
-- shape; NULL: none declared), applied when the gateway creates the destination table; and how
-- an existing destination table's layout differs from it, as the resource's last prepare found
-- ([{"option", "table", "declared"}]; NULL: no difference, or not compared yet). An existing
-- table is never re-laid out.
ALTER TABLE resources ADD COLUMN table_options JSONB, ADD COLUMN layout_mismatch JSONB;
