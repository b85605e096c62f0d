-- How an app's client tokens are checked beyond its secret: an identity
-- provider's JWKS URL or a PEM public key, the expected iss and aud, and
-- the claim that names the user (proto.Identity as JSON; NULL: the secret
-- alone, sub names the user).
ALTER TABLE apps ADD COLUMN identity jsonb;
