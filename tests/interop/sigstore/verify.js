// Verify sigstore bundles v0.3 offline with the sigstore project's own verifier (@sigstore/verify):
// the public key is the only trust material, no transparency log or timestamp is required (thresholds 0).
//
//   node verify.js PUBLIC_KEY.pem BUNDLE.json...
//
// Prints one JSON line per bundle: {"bundle": PATH, "ok": true|false, "error": "..."}; exits 1 when any
// bundle does not verify.
'use strict';
const fs = require('fs');
const crypto = require('crypto');
const { bundleFromJSON } = require('@sigstore/bundle');
const { Verifier, toSignedEntity, toTrustMaterial } = require('@sigstore/verify');

const [keyPath, ...bundles] = process.argv.slice(2);
if (!keyPath || bundles.length === 0) {
  console.error('usage: node verify.js PUBLIC_KEY.pem BUNDLE.json...');
  process.exit(2);
}
const der = crypto.createPublicKey(fs.readFileSync(keyPath)).export({ format: 'der', type: 'spki' });
const emptyRoot = { certificateAuthorities: [], timestampAuthorities: [], tlogs: [], ctlogs: [] };
// Any hint finds the one trusted key: the hint is not trusted (like servimg's keyids), the signature is.
const trust = toTrustMaterial(emptyRoot, () => ({
  publicKey: crypto.createPublicKey({ key: der, format: 'der', type: 'spki' }),
  validFor: () => true,
}));
const verifier = new Verifier(trust, { tlogThreshold: 0, ctlogThreshold: 0, timestampThreshold: 0 });
let failed = 0;
for (const path of bundles) {
  try {
    const bundle = bundleFromJSON(JSON.parse(fs.readFileSync(path, 'utf8')));
    verifier.verify(toSignedEntity(bundle));
    console.log(JSON.stringify({ bundle: path, ok: true }));
  } catch (e) {
    failed += 1;
    console.log(JSON.stringify({ bundle: path, ok: false, error: String(e && e.message ? e.message : e) }));
  }
}
process.exit(failed ? 1 : 0);
