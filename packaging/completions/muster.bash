# bash completion for musterctl, muster-run and musterd.
#
# Installed by tools/install.sh as share/bash-completion/completions/musterctl
# with muster-run and musterd as links to it (bash-completion loads a file by
# the command's name). Sourcing it by hand works too: `. muster.bash`.
#
# The flags, and musterctl's commands, are read from the program's own --help
# (once per shell and program, then cached), so completion never drifts from
# the binary: every "  --flag" line of the Flags list is a flag, "  --flag
# VALUE" takes a value, and musterctl's "Commands:" rows give the commands and
# the store subcommands. One-letter aliases ("-m, --module") complete too.

# _muster_help_cache PROGRAM: fills _muster_flags, _muster_value_flags,
# _muster_commands and _muster_store_commands for PROGRAM (a path or a name
# on PATH). Results are cached in _MUSTER_COMPLETION_CACHE, keyed by PROGRAM.
_muster_help_cache() {
  local prog=$1 key
  key=${prog//[^A-Za-z0-9]/_}
  if [[ -z ${_MUSTER_COMPLETION_CACHE_KEYS:-} || " $_MUSTER_COMPLETION_CACHE_KEYS " != *" $key "* ]]; then
    local help line in_flags=0 in_commands=0 flags="" value_flags="" commands="" store=""
    help=$(command "$prog" --help 2>/dev/null) || help=""
    while IFS= read -r line; do
      if [[ $line == "Flags:" ]]; then
        in_flags=1
        in_commands=0
        continue
      fi
      if [[ $line == "Commands:" ]]; then
        in_commands=1
        continue
      fi
      if ((in_flags)); then
        # "  --flag", "  --flag VALUE", "  -f, --flag [VALUE]"
        if [[ $line =~ ^\ \ (-[A-Za-z],\ )?(--[A-Za-z0-9_-]+)(\ [A-Z]+)?$ ]]; then
          local short=${BASH_REMATCH[1]%, } long=${BASH_REMATCH[2]}
          flags+=" $long${short:+ $short}"
          [[ -n ${BASH_REMATCH[3]} ]] && value_flags+=" $long${short:+ $short}"
        fi
      elif ((in_commands)); then
        [[ -z $line ]] && { in_commands=0; continue; }
        if [[ $line =~ ^\ \ ([a-z][a-z-]*)(\ ([a-z][a-z-]*))? ]]; then
          [[ " $commands " == *" ${BASH_REMATCH[1]} "* ]] || commands+=" ${BASH_REMATCH[1]}"
          if [[ ${BASH_REMATCH[1]} == store && -n ${BASH_REMATCH[3]} ]]; then
            store+=" ${BASH_REMATCH[3]}"
          fi
        fi
      fi
    done <<<"$help"
    eval "_MUSTER_CC_${key}_flags=\$flags"
    eval "_MUSTER_CC_${key}_value_flags=\$value_flags"
    eval "_MUSTER_CC_${key}_commands=\$commands"
    eval "_MUSTER_CC_${key}_store=\$store"
    _MUSTER_COMPLETION_CACHE_KEYS="${_MUSTER_COMPLETION_CACHE_KEYS:-} $key"
  fi
  eval "_muster_flags=\$_MUSTER_CC_${key}_flags"
  eval "_muster_value_flags=\$_MUSTER_CC_${key}_value_flags"
  eval "_muster_commands=\$_MUSTER_CC_${key}_commands"
  eval "_muster_store_commands=\$_MUSTER_CC_${key}_store"
}

# _muster_complete_value FLAG CUR: the value of FLAG. Flags that name files
# and directories complete paths; the others have nothing to offer.
_muster_complete_value() {
  case $1 in
    --socket | --*-file | --*file | --tls-* | --musterd | --gpu-plugin | --dump-dir | --state-dir | \
      --log-dir | --log_dir | --run-path | --run_path)
      mapfile -t COMPREPLY < <(compgen -f -- "$2")
      compopt -o filenames 2>/dev/null
      ;;
    --restart-policy) mapfile -t COMPREPLY < <(compgen -W "job rank" -- "$2") ;;
    --rdzv-backend | --rdzv_backend)
      mapfile -t COMPREPLY < <(compgen -W "static c10d muster" -- "$2") ;;
    --nproc-per-node | --nproc_per_node)
      mapfile -t COMPREPLY < <(compgen -W "auto cpu gpu 1 2 4 8" -- "$2") ;;
    --redirects | --tee | -r | -t) mapfile -t COMPREPLY < <(compgen -W "0 1 2 3" -- "$2") ;;
    --bind) mapfile -t COMPREPLY < <(compgen -W "cores none" -- "$2") ;;
    --log-level) mapfile -t COMPREPLY < <(compgen -W "debug info warning error" -- "$2") ;;
    *) COMPREPLY=() ;;
  esac
}

# _muster_is_value_flag FLAG: whether FLAG takes a separate value.
_muster_is_value_flag() {
  [[ " $_muster_value_flags " == *" $1 "* ]]
}

_musterctl() {
  local cur=${COMP_WORDS[COMP_CWORD]} prev=""
  ((COMP_CWORD > 0)) && prev=${COMP_WORDS[COMP_CWORD - 1]}
  local _muster_flags _muster_value_flags _muster_commands _muster_store_commands
  _muster_help_cache "${COMP_WORDS[0]}"
  [[ -z $_muster_commands ]] &&
    _muster_commands=" status store jobs ranks groups group abort gpu trace why"
  [[ -z $_muster_store_commands ]] && _muster_store_commands=" get set add del keys wait"
  COMPREPLY=()
  if _muster_is_value_flag "$prev"; then
    _muster_complete_value "$prev" "$cur"
    return 0
  fi
  if [[ $cur == -* ]]; then
    mapfile -t COMPREPLY < <(compgen -W "$_muster_flags" -- "$cur")
    return 0
  fi
  # The positional words before the cursor, flags and their values skipped.
  local i word positional=()
  for ((i = 1; i < COMP_CWORD; ++i)); do
    word=${COMP_WORDS[i]}
    if [[ $word == --* ]]; then
      [[ $word != *=* ]] && _muster_is_value_flag "$word" && ((++i))
      continue
    fi
    positional+=("$word")
  done
  if ((${#positional[@]} == 0)); then
    mapfile -t COMPREPLY < <(compgen -W "$_muster_commands" -- "$cur")
  elif [[ ${positional[0]} == store && ${#positional[@]} -eq 1 ]]; then
    mapfile -t COMPREPLY < <(compgen -W "$_muster_store_commands" -- "$cur")
  fi
  return 0
}

_muster_run() {
  local cur=${COMP_WORDS[COMP_CWORD]} prev=""
  ((COMP_CWORD > 0)) && prev=${COMP_WORDS[COMP_CWORD - 1]}
  local _muster_flags _muster_value_flags _muster_commands _muster_store_commands
  _muster_help_cache "${COMP_WORDS[0]}"
  COMPREPLY=()
  # After "--" or the first positional word (the program or script), the rest
  # is the job's command line: a command first, then files.
  local i word command_at=-1
  for ((i = 1; i < COMP_CWORD; ++i)); do
    word=${COMP_WORDS[i]}
    if [[ $word == -- ]]; then
      command_at=$((i + 1))
      break
    fi
    if [[ $word == -* ]]; then
      [[ $word != *=* ]] && _muster_is_value_flag "$word" && ((++i))
      continue
    fi
    command_at=$i
    break
  done
  if ((command_at >= 0)); then
    if ((COMP_CWORD == command_at)); then
      mapfile -t COMPREPLY < <(compgen -c -- "$cur"; compgen -f -- "$cur")
    else
      mapfile -t COMPREPLY < <(compgen -f -- "$cur")
    fi
    compopt -o filenames 2>/dev/null
    return 0
  fi
  if _muster_is_value_flag "$prev"; then
    _muster_complete_value "$prev" "$cur"
    return 0
  fi
  if [[ $cur == -* ]]; then
    mapfile -t COMPREPLY < <(compgen -W "$_muster_flags --" -- "$cur")
    return 0
  fi
  mapfile -t COMPREPLY < <(compgen -f -- "$cur")
  compopt -o filenames 2>/dev/null
  return 0
}

_musterd() {
  local cur=${COMP_WORDS[COMP_CWORD]} prev=""
  ((COMP_CWORD > 0)) && prev=${COMP_WORDS[COMP_CWORD - 1]}
  local _muster_flags _muster_value_flags _muster_commands _muster_store_commands
  _muster_help_cache "${COMP_WORDS[0]}"
  COMPREPLY=()
  if _muster_is_value_flag "$prev"; then
    _muster_complete_value "$prev" "$cur"
    return 0
  fi
  mapfile -t COMPREPLY < <(compgen -W "$_muster_flags" -- "$cur")
  return 0
}

complete -F _musterctl musterctl
complete -F _muster_run muster-run
complete -F _musterd musterd
