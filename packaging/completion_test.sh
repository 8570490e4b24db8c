#!/usr/bin/env bash
# The bash completion (packaging/completions/muster.bash): it sources cleanly
# in a plain bash (no bash-completion package), registers musterctl,
# muster-run and musterd (`complete -p`), and completes musterctl's commands
# and store subcommands, every flag each program's --help lists, flag values,
# and muster-run's job command line.
source "$(dirname "${BASH_SOURCE[0]}")/testlib.sh"

script=$R/packaging/completions/muster.bash
export PATH="$R/tools:$R/daemon:$PATH"

# complete WORD... : the candidates a completion of the last word offers, one
# per line, sorted, in a fresh bash that sourced the script.
complete_words() {
  bash --norc --noprofile -c '
    source "$1" || exit 3
    shift
    COMP_WORDS=("$@")
    COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
    COMP_LINE="$*"
    COMP_POINT=${#COMP_LINE}
    spec=$(complete -p "$1") || exit 4
    fn=${spec#*-F }
    fn=${fn%% *}
    "$fn" "$1" "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
    printf "%s\n" "${COMPREPLY[@]}" | sort -u
  ' bash "$script" "$@"
}

errors=$(bash --norc --noprofile -c 'set -u; source "$1"' bash "$script" 2>&1)
check_eq "sources cleanly (set -u, no output)" "$errors" ""
specs=$(bash --norc --noprofile -c 'source "$1"; complete -p musterctl muster-run musterd' bash "$script" 2>&1)
check_has "complete -p musterctl" "$specs" "^complete -F _musterctl musterctl$"
check_has "complete -p muster-run" "$specs" "^complete -F _muster_run muster-run$"
check_has "complete -p musterd" "$specs" "^complete -F _musterd musterd$"

# Every command of musterctl --help, and only those, for an empty word.
want=$(musterctl --help | sed -n '/^Commands:/,/^$/s/^  \([a-z][a-z-]*\).*/\1/p' | sort -u)
check_eq "musterctl <TAB>: the commands of --help" "$(complete_words musterctl "")" "$want"
check_eq "musterctl st<TAB>" "$(complete_words musterctl st)" $'status\nstore'
check_eq "musterctl store <TAB>" "$(complete_words musterctl store "")" \
  "$(printf '%s\n' add del get keys set wait)"
check_eq "musterctl store ke<TAB>" "$(complete_words musterctl store ke)" keys
check_eq "a flag's value is not a command: musterctl --job x gr<TAB>" \
  "$(complete_words musterctl --job x gr)" $'group\ngroups'
check_eq "bool flags take no value: musterctl --json gr<TAB>" \
  "$(complete_words musterctl --json gr)" $'group\ngroups'
check_eq "musterctl --js<TAB>" "$(complete_words musterctl --js)" --json
mkdir -p "$TMP/sockdir" && touch "$TMP/sockdir/d.sock"
check_eq "musterctl --socket <path><TAB>" "$(complete_words musterctl --socket "$TMP/sockdir/d")" \
  "$TMP/sockdir/d.sock"

# Commands, subcommands and flags come from the --help of the musterctl on
# PATH (a newer one's new command completes): a stand-in with its own help.
mkdir -p "$TMP/fake"
cat >"$TMP/fake/musterctl" <<'FAKE'
#!/bin/sh
cat <<'HELP'
musterctl: a stand-in.
Usage: musterctl [flags] COMMAND

Commands:
  status                 s
  store get KEY          g
  store frob KEY         f
  brandnew [X]           b
                         continued

Flags:
  --socket VALUE
      s
  --fresh-flag
      f
  --help
      Print this help and exit.
HELP
FAKE
chmod +x "$TMP/fake/musterctl"
check_eq "commands from the program's --help" \
  "$(PATH="$TMP/fake:$PATH" complete_words musterctl "")" $'brandnew\nstatus\nstore'
check_eq "store subcommands from the program's --help" \
  "$(PATH="$TMP/fake:$PATH" complete_words musterctl store "")" $'frob\nget'
check_eq "flags from the program's --help" \
  "$(PATH="$TMP/fake:$PATH" complete_words musterctl --)" $'--fresh-flag\n--help\n--socket'
check_eq "bool flags from --help take no value" \
  "$(PATH="$TMP/fake:$PATH" complete_words musterctl --fresh-flag b)" brandnew

# Every flag in each program's --help completes from "--".
for prog in musterctl muster-run musterd; do
  got=$(complete_words "$prog" --)
  n=0
  while read -r flag; do
    n=$((n + 1))
    grep -qx -- "$flag" <<<"$got" || fail "$prog --<TAB> lacks $flag"
  done < <("$prog" --help | sed -n 's/^  \(-[A-Za-z], \)\{0,1\}\(--[A-Za-z0-9_-]*\).*/\2/p')
  ((n > 3)) && pass "$prog --<TAB> offers all $n flags of --help" || fail "$prog --help has $n flags"
done

check_has "muster-run --nproc<TAB>" "$(complete_words muster-run --nproc)" "^--nproc-per-node$"
# One-letter aliases ("-m, --module" in --help) complete, and -r takes a value.
check_has "muster-run -<TAB> offers -m" "$(complete_words muster-run -)" "^-m$"
check_eq "muster-run -r <TAB>" "$(complete_words muster-run -r "")" $'0\n1\n2\n3'
check_eq "muster-run --rdzv-backend <TAB>" "$(complete_words muster-run --rdzv-backend "")" \
  $'c10d\nmuster\nstatic'
touch "$TMP/sockdir/train.py"
check_has "muster-run --nnodes 2 train.py <path><TAB>: the script's own words are files" \
  "$(complete_words muster-run --nnodes 2 train.py "$TMP/sockdir/tr")" "train\.py$"
check_eq "muster-run --restart-policy <TAB>" "$(complete_words muster-run --restart-policy "")" \
  $'job\nrank'
check_has "muster-run ... -- ech<TAB>: a command" \
  "$(complete_words muster-run --nproc-per-node 2 -- ech)" "^echo$"
touch "$TMP/sockdir/train.py"
check_eq "muster-run ... -- cmd <path><TAB>: files" \
  "$(complete_words muster-run -- python3 "$TMP/sockdir/tr")" "$TMP/sockdir/train.py"
check_eq "musterd --log-level <TAB>" "$(complete_words musterd --log-level "")" \
  "$(printf '%s\n' debug error info warning)"

finish completion_test
