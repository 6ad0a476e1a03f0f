// Validate a Kyverno ClusterPolicy (JSON) with the Kyverno CRDs' own schemas, as @kubernetes-models/kyverno
// generates them from the project's published CRDs: types, enums and required fields (ClusterPolicy.validate),
// and every field name the document uses must be one those schemas declare (they do not forbid unknown
// fields, so a misspelt one would pass validate() and be ignored by the cluster).
//
//   node kyverno.mjs POLICY.json      prints {"ok": true} or {"ok": false, "error": "..."}; exit 1 when invalid
import fs from 'fs';
import path from 'path';
import { createRequire } from 'module';
import { ClusterPolicy } from '@kubernetes-models/kyverno/kyverno.io/v1';

const doc = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const problems = [];
try {
  new ClusterPolicy(doc).validate();
} catch (e) {
  problems.push(String(e.message));
}
const require = createRequire(import.meta.url);
const schemas = path.join(path.dirname(require.resolve('@kubernetes-models/kyverno/package.json')), '_schemas');
const text = fs.readdirSync(schemas)
  .filter((f) => f.includes('KyvernoV1'))
  .map((f) => fs.readFileSync(path.join(schemas, f), 'utf8'))
  .join('\n');
const free = new Set(['annotations', 'labels', 'conditions']); // maps, and JMESPath expressions under them
function walk(value, where) {
  if (Array.isArray(value)) return value.forEach((v, i) => walk(v, `${where}[${i}]`));
  if (value === null || typeof value !== 'object') return;
  for (const [key, v] of Object.entries(value)) {
    const known = ['apiVersion', 'kind', 'metadata', 'name'].includes(key) || text.includes(`"${key}"`) || text.includes(`.${key}`);
    if (!known) problems.push(`${where}.${key}: not a field of the Kyverno v1 schemas`);
    if (!free.has(key)) walk(v, `${where}.${key}`);
  }
}
walk(doc.spec, 'spec');
console.log(JSON.stringify(problems.length ? { ok: false, error: problems.join('; ') } : { ok: true }));
process.exit(problems.length ? 1 : 0);
