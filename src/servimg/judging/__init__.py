"""Judging an image by what is said about it: `servimg check` (locate and gather the evidence, then a
pure evaluation by a policy), the policy, the fixes an image proves, index checks, rebuild-to-verify,
and the policy export for deploy-side gates."""
