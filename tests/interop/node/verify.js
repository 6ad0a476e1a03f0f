// Verify sigstore bundles v0.3 offline with the sigstore project's own verifier (@sigstore/verify):
// the public key is the only trust material, no transparency log or timestamp is required (thresholds 0).
//
//   node verify.js PUBLIC_KEY.pem BUNDLE.json...
//
// Each bundle is also read with the sigstore protobuf-specs' own generated code (@sigstore/protobuf-specs,
// Bundle.fromJSON then toJSON): a field it does not know, or one of the wrong type, does not survive the
// round trip ("schema": false).
//
// Prints one JSON line per bundle: {"bundle": PATH, "ok": true|false, "schema": true|false, "error": "..."};
// exits 1 when any bundle does not verify or does not round-trip.
'use strict';
const fs = require('fs');
const crypto = require('crypto');
const { bundleFromJSON } = require('@sigstore/bundle');
const { Verifier, toSignedEntity, toTrustMaterial } = require('@sigstore/verify');
const { Bundle } = require('@sigstore/protobuf-specs');

// What the protobuf JSON mapping keeps of a value: empty lists and objects are the default, and dropped.
function pruned(value) {
  if (Array.isArray(value)) return value.length ? value.map(pruned) : undefined;
  if (value && typeof value === 'object') {
    const out = {};
    for (const key of Object.keys(value).sort()) {
      const v = pruned(value[key]);
      if (v !== undefined) out[key] = v;
    }
    return Object.keys(out).length ? out : undefined;
  }
  return value;
}

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
  let schema = false;
  try {
    const json = JSON.parse(fs.readFileSync(path, 'utf8'));
    schema = JSON.stringify(pruned(Bundle.toJSON(Bundle.fromJSON(json)))) === JSON.stringify(pruned(json));
    const bundle = bundleFromJSON(json);
    verifier.verify(toSignedEntity(bundle));
    if (!schema) throw new Error('the bundle does not round-trip through the protobuf-specs Bundle');
    console.log(JSON.stringify({ bundle: path, ok: true, schema }));
  } catch (e) {
    failed += 1;
    console.log(JSON.stringify({ bundle: path, ok: false, schema, error: String(e && e.message ? e.message : e) }));
  }
}
process.exit(failed ? 1 : 0);
