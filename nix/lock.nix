# The lock reader, builtins only (no nixpkgs): every `images/<name>.yaml` that has an
# `images/<name>.lock.json` becomes `images.<name>`, the lock's values verbatim (the same JSON that
# `servimg.definitions.lock.Lock.load(path).to_json()` returns, defaults filled in) plus a few derived values.
#
# Forcing `images.<name>` refuses exactly what `servimg build` refuses before it touches the base:
#   - a malformed lock (missing or unknown keys, a malformed digest, lock_version other than 1);
#   - a patch whose sha256 (`builtins.hashFile "sha256"`) is not the lock's `patch_sha256`;
#   - a definition that no longer pins what the lock pins. The definition is YAML, which builtins
#     cannot parse (and `definition_sha256` is a digest of pydantic's canonical dump of it, which Nix
#     cannot recompute), so this is a TEXT check: the definition must contain each overlay's locked
#     patch sha256 and the locked base digest (the manifest's, or the multi-platform index's when the
#     lock records one). It catches every edit of those pins; it cannot
#     see other definition edits (packages, sentinels, tag ...), which `servimg build` reports as
#     `definition_sha256` drift.
# Facts that need the base image (layers, interpreter, per-file pre/post hashes) are checked by
# `servimg build` itself, inside the image derivation (nix/image.nix).
#
#   import ./nix/lock.nix { }                       # this repository
#   import ./nix/lock.nix { root = ./.; }           # from flake.nix (root is then a store path)
#   nix-instantiate --eval --strict --json nix/lock.nix -A images.demo
{
  # root: the repository root: a path, or a string naming a directory (e.g. a store path).
  # Default: the parent of this file's directory.
  root ? ../.,
  # imagesDir: where the definitions and their locks live, relative to root. Default: "images".
  imagesDir ? "images",
}:
let
  inherit (builtins)
    all attrNames concatLists concatStringsSep elem filter foldl' fromJSON genList hashFile hashString
    isAttrs isInt isList isString length listToAttrs match pathExists readDir readFile stringLength
    substring toJSON typeOf
    ;

  at = rel: if builtins.isPath root then root + "/${rel}" else "${toString root}/${rel}";

  hasSuffix = suffix: s:
    let
      ls = stringLength s;
      lf = stringLength suffix;
    in
    ls >= lf && substring (ls - lf) lf s == suffix;
  removeSuffix = suffix: s: if hasSuffix suffix s then substring 0 (stringLength s - stringLength suffix) s else s;
  contains = needle: haystack: builtins.replaceStrings [ needle ] [ "" ] haystack != haystack;
  imap0 = f: list: genList (i: f i (builtins.elemAt list i)) (length list);
  quote = v: toJSON v;

  # servimg's own version: the default of Lock.tool when a lock omits it (servimg/__init__.py mirrors
  # pyproject's version).
  servimgVersion =
    if pathExists (at "pyproject.toml") then (builtins.fromTOML (readFile (at "pyproject.toml"))).project.version else null;

  # The lock schema, mirrored from the dataclasses in src/servimg/definitions/lock.py: the keys without a default,
  # and the defaults of the others (tests/test_nix.py asserts both equal the dataclass fields, so a
  # schema change fails a test rather than a build). Lock.tool defaults to this servimg's name/version.
  schema = {
    lock = {
      required = [ "name" "definition_sha256" "base" "interpreter" "packages" "overlays" "source_date_epoch" ];
      defaults = { lock_version = 1; ladder = null; } // (if servimgVersion == null then { } else { tool = { name = "servimg"; version = servimgVersion; }; });
      optional = [ "tool" "lock_version" "ladder" ];
    };
    base = {
      required = [ "ref" "manifest_digest" "config_digest" "diff_ids" "created" ];
      defaults = { index_digest = null; };
    };
    interpreter = {
      required = [ "path" "resolved" "version" "magic" "cache_tag" "opt_levels" "pycache_prefix" ];
      defaults = { };
    };
    package = {
      required = [ "import_name" "distribution" "version" "site_packages" "dist_info" "record_sha256" ];
      defaults = { };
    };
    overlay = {
      required = [ "id" "package" "patch" "patch_sha256" "files" ];
      defaults = { sentinels_absent_in_base = [ ]; fixes = [ ]; };
    };
    file = {
      required = [ "path" "pre_sha256" "post_sha256" "mode" ];
      defaults = { };
    };
  };
  optionalKeys = kind: schema.${kind}.optional or (attrNames schema.${kind}.defaults);

  join = where: key: if where == "" then key else "${where}.${key}";

  # Problems with the shape of one JSON object (missing/unknown keys), Python-style paths.
  shape = where: kind: value:
    let
      s = schema.${kind};
    in
    if !(isAttrs value) then
      [ "${if where == "" then "<root>" else where}: expected an object, got ${typeOf value}" ]
    else
      map (k: "${join where k}: required key is missing") (filter (k: !(value ? ${k})) s.required)
      ++ map (k: "${join where k}: unknown key") (filter (k: !(elem k (s.required ++ optionalKeys kind))) (attrNames value));

  listOf = where: kind: value:
    if !(isList value) then [ "${where}: expected a list, got ${typeOf value}" ]
    else concatLists (imap0 (i: v: shape "${where}[${toString i}]" kind v) value);

  isDigest = s: isString s && match "sha256:[0-9a-f]{64}" s != null;
  isHex = s: isString s && match "[0-9a-f]{64}" s != null;

  malformed = raw:
    let
      top = shape "" "lock" raw;
      nested =
        (if raw ? base then shape "base" "base" raw.base else [ ])
        ++ (if raw ? interpreter then shape "interpreter" "interpreter" raw.interpreter else [ ])
        ++ (if raw ? packages then listOf "packages" "package" raw.packages else [ ])
        ++ (if raw ? overlays then listOf "overlays" "overlay" raw.overlays else [ ]);
      overlayFiles =
        if raw ? overlays && isList raw.overlays && all isAttrs raw.overlays then
          concatLists (imap0 (i: o: if o ? files then listOf "overlays[${toString i}].files" "file" o.files else [ ]) raw.overlays)
        else [ ];
      values =
        if top != [ ] || nested != [ ] then [ ]
        else
          filter (p: p != null) (
            [
              (if isString raw.name then null else "name: expected a string")
              (if isInt raw.source_date_epoch && raw.source_date_epoch >= 0 then null else "source_date_epoch: expected a non-negative integer")
              (if isHex raw.definition_sha256 then null else "definition_sha256: expected 64 lowercase hex characters")
              (if isDigest raw.base.manifest_digest then null else "base.manifest_digest: not a sha256 digest")
              (if isDigest raw.base.config_digest then null else "base.config_digest: not a sha256 digest")
              (if isList raw.base.diff_ids && all isDigest raw.base.diff_ids then null else "base.diff_ids: expected a list of sha256 digests")
              (if (raw.base.index_digest or null) == null || isDigest raw.base.index_digest then null else "base.index_digest: not a sha256 digest")
            ]
            ++ imap0 (i: o: if isHex o.patch_sha256 then null else "overlays[${toString i}].patch_sha256: expected 64 lowercase hex characters") raw.overlays
          );
    in
    top ++ nested ++ overlayFiles ++ values;

  # Lock.to_json(): the dataclass defaults filled in, everything else verbatim.
  fill = kind: value: schema.${kind}.defaults // value;
  # Lock.to_json() leaves `ladder` out when there is none, and an overlay's `fixes` when it declares none
  # (so locks without them keep their digest).
  overlayJson = o: let filled = fill "overlay" o; in if filled.fixes == [ ] then removeAttrs filled [ "fixes" ] else filled;
  complete = raw:
    let
      filled = fill "lock" raw // {
        base = fill "base" raw.base;
        overlays = map overlayJson raw.overlays;
      };
    in
    if filled.ladder == null then removeAttrs filled [ "ladder" ] else filled;

  fail = origin: header: problems: hint:
    throw (
      "servimg (nix/lock.nix): ${origin}: ${header}\n"
      + concatStringsSep "\n" (map (p: "  - ${p}") problems)
      + "\n  hint: ${hint}"
    );

  # One image: the definition `images/<stem>.yaml` and its lock `images/<stem>.lock.json`.
  readImage = definitionFile:
    let
      stem = removeSuffix ".yml" (removeSuffix ".yaml" definitionFile);
      definition = "${imagesDir}/${definitionFile}";
      lockFile = "${imagesDir}/${stem}.lock.json";
      raw = fromJSON (readFile (at lockFile));
      shapeProblems = malformed raw;
      lock = complete raw;
      definitionText = readFile (at definition);

      patchProblems = concatLists (imap0
        (i: o:
          let
            where = "overlays[${toString i}]";
            exists = pathExists (at o.patch);
            actual = hashFile "sha256" (at o.patch);
          in
          if !exists then [ "${where}.patch: cannot read ${o.patch} (overlay ${o.id})" ]
          else
            (if actual == o.patch_sha256 then [ ]
            else [ "${where}.patch_sha256: locked ${quote o.patch_sha256}, now ${quote actual} (${o.patch}, overlay ${o.id})" ])
            ++ (if contains o.patch_sha256 definitionText then [ ]
            else [ "${where}.patch_sha256: ${definition} does not pin the locked ${o.patch_sha256} (overlay ${o.id}; text check)" ]))
        lock.overlays);
      # The definition's base.digest is the manifest, or the multi-platform index the lock records.
      basePin = if lock.base.index_digest != null then lock.base.index_digest else lock.base.manifest_digest;
      baseProblems =
        if contains basePin definitionText then [ ]
        else [ "base.${if lock.base.index_digest != null then "index_digest" else "manifest_digest"}: ${definition} does not pin the locked ${basePin} (text check)" ];
      versionProblems =
        if lock.lock_version == 1 then [ ]
        else [ "lock_version: lock version ${toString lock.lock_version} is not 1" ];
      drift = versionProblems ++ baseProblems ++ patchProblems;

      transport =
        let r = lock.base.ref; in
        if match "docker-daemon:.*" r != null then "engine"
        else if match "oci:.*" r != null then "oci"
        else if match "docker-archive:.*" r != null then "archive"
        else "registry";

      value = lock // {
        # str(Lock.digest): sha256 of the canonical JSON (sorted keys, no whitespace, UTF-8). builtins.toJSON
        # writes the same bytes for every string a lock holds (paths, hex, versions); it would differ
        # only for \b or \f inside a string.
        digest = "sha256:" + hashString "sha256" (toJSON lock);
        # Repository-relative paths of the definition and the lock.
        inherit definition;
        lock_file = lockFile;
        # engine | oci | archive | registry, from base.ref's prefix (as servimg.definitions.definition.BaseSpec).
        base_transport = transport;
      };
    in
    if shapeProblems != [ ] then
      fail lockFile "malformed lock (${toString (length shapeProblems)} problem(s))" shapeProblems
        "do not edit locks by hand; regenerate with `servimg lock ${definition}`"
    else if drift != [ ] then
      fail lockFile "inputs drifted from the lock (${toString (length drift)} field(s))" drift
        "if the change is intended, run `servimg lock ${definition}` and review the diff"
    else value;

  entries = readDir (at imagesDir);
  lockedFiles = filter
    (f:
      entries.${f} == "regular"
      && (hasSuffix ".yaml" f || hasSuffix ".yml" f)
      && pathExists (at "${imagesDir}/${removeSuffix ".yml" (removeSuffix ".yaml" f)}.lock.json"))
    (attrNames entries);
  stemOf = f: removeSuffix ".yml" (removeSuffix ".yaml" f);
  # A multi-platform lock (`base.platforms`, docs/platforms.md: a complete lock per platform under
  # `platforms`) is not built by the flake: each platform's derivation would need an emulating builder
  # (extra-platforms and binfmt inside the sandbox). `servimg build` builds it; it is listed in
  # `multiPlatform`, never silently dropped.
  isMultiPlatform = f: (fromJSON (readFile (at "${imagesDir}/${stemOf f}.lock.json"))) ? platforms;
  definitionFiles = filter (f: !(isMultiPlatform f)) lockedFiles;

  images = listToAttrs (map (f: { name = stemOf f; value = readImage f; }) definitionFiles);
in
{
  # images.<stem>: the checked lock values (throws on a malformed lock or drift when forced).
  inherit images;
  # The stems of every definition that has a (single-platform) lock, sorted.
  names = map stemOf definitionFiles;
  # The stems of the multi-platform ones (not built by the flake; see isMultiPlatform).
  multiPlatform = map stemOf (filter isMultiPlatform lockedFiles);
  # true once every image's lock is checked (forces them all; throws on the first problem).
  ok = foldl' (acc: name: builtins.seq (builtins.deepSeq images.${name} true) acc) true (attrNames images);
  # The schema mirrored from src/servimg/definitions/lock.py (for the test that keeps both in step).
  inherit schema;
}
