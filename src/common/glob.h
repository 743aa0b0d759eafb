#pragma once

#include <string>
#include <vector>

// Glob matching, for the gate's rules, egress policies and secrets' hosts,
// and moat-init's judgment of programs: one implementation for all.
namespace moat {

// "*", "?" and "\" escapes. With `segments`, "*" and "?" stop at '/' and
// "**" crosses it (paths); otherwise "*" matches anything.
bool globMatch(const std::string& pattern, const std::string& text, bool segments);
// A pattern that matches exactly `text` (glob characters escaped).
std::string globEscape(const std::string& text);
// A command line against argument patterns (a run_command rule's "match"):
// one glob per argument, a last "*" takes any rest (none included), else the
// counts must be equal; a first pattern without '/' names a program, so it
// also matches the base name of argv[0] ("rm" matches "/usr/bin/rm").
bool argvMatch(const std::vector<std::string>& patterns, const std::vector<std::string>& argv);
// What a program an environment's process starts is judged as: its argv
// with the file the exec names in argv[0]'s place. argv[0] is the caller's
// to choose (execv("/usr/bin/rm", {"ls", ...}) runs rm): judged by it, a
// rule on "rm" would not see rm run.
std::vector<std::string> judgedArgv(const std::string& program, std::vector<std::string> argv);

}  // namespace moat
