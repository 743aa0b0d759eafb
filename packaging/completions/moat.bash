# bash completion for moat and moatd: the commands, subcommands and flags
# their own --help texts list (so a new flag completes without an edit here).

_moat_help_commands() {
  moat --help 2>/dev/null | awk '/^commands:/ { inside = 1; next } inside && /^$/ { exit } inside && /^  [a-z]/ { print $1 }'
}

_moat_help_flags() {
  "$@" --help 2>/dev/null | grep -oE -- '--[a-z][a-z0-9-]*' | sort -u
}

# A command's subcommands: its help's "commands:" list, and "a|b|c" after
# "moat CMD " in the text.
_moat_help_subcommands() {
  moat "$1" --help 2>/dev/null | awk -v c="$1" '/^commands:/ { inside = 1; next } inside && /^[A-Za-z]/ { inside = 0 } inside && /^  [a-z]/ { print $1 } { line = $0; p = "moat " c " "; while ((i = index(line, p)) > 0) { line = substr(line, i + length(p)); if (match(line, /^[a-z]+(\|[a-z]+)*/)) { n = split(substr(line, 1, RLENGTH), w, "|"); for (k = 1; k <= n; k++) print w[k] } } }' | sort -u
}

_moat() {
  local cur=${COMP_WORDS[COMP_CWORD]}
  COMPREPLY=()
  if [ "$COMP_CWORD" -eq 1 ]; then
    mapfile -t COMPREPLY < <(compgen -W "$(_moat_help_commands) --help --version" -- "$cur")
    return
  fi
  local command=${COMP_WORDS[1]}
  if [[ $cur == -* ]]; then
    mapfile -t COMPREPLY < <(compgen -W "$(_moat_help_flags moat "$command")" -- "$cur")
    return
  fi
  if [ "$COMP_CWORD" -eq 2 ]; then
    mapfile -t COMPREPLY < <(compgen -W "$(_moat_help_subcommands "$command")" -- "$cur")
    [ ${#COMPREPLY[@]} -gt 0 ] && return
  fi
  mapfile -t COMPREPLY < <(compgen -f -- "$cur")
}

_moatd() {
  local cur=${COMP_WORDS[COMP_CWORD]}
  COMPREPLY=()
  if [[ $cur == -* ]]; then
    mapfile -t COMPREPLY < <(compgen -W "$(_moat_help_flags moatd)" -- "$cur")
    return
  fi
  mapfile -t COMPREPLY < <(compgen -f -- "$cur")
}

complete -F _moat moat
complete -F _moatd moatd
