-- The statements of the HTTP entry point (drainer.http).

-- name: http_remember_signature
-- A signed request's signature, remembered until its window has passed: a row back
-- when it is new, none when another request (on any instance) carried it already.
-- Signatures whose window has passed go in the same statement.
WITH pruned AS (
  DELETE FROM drainer_signatures WHERE expires_at < now()
)
INSERT INTO drainer_signatures (signature, expires_at)
VALUES (%(signature)s, now() + make_interval(secs => %(keep)s))
ON CONFLICT (signature) DO NOTHING
RETURNING true;
