# fish completion for moat and moatd: the commands and flags their own
# --help texts list.
function __moat_commands
    moat --help 2>/dev/null | awk '/^commands:/ { inside = 1; next } inside && /^$/ { exit } inside && /^  [a-z]/ { print $1 }'
end

function __moat_flags
    set -l command (commandline -opc)[2]
    moat $command --help 2>/dev/null | string match -ar -- '--[a-z][a-z0-9-]*' | sort -u
end

complete -c moat -f -n __fish_use_subcommand -a '(__moat_commands)'
complete -c moat -n 'not __fish_use_subcommand' -a '(__moat_flags)'
complete -c moatd -a '(moatd --help 2>/dev/null | string match -ar -- "--[a-z][a-z0-9-]*" | sort -u)'
