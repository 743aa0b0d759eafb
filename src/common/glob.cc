#include "common/glob.h"

#include <algorithm>

namespace moat {

// One pass over the text with the set of pattern positions still possible
// (a Thompson NFA): time pattern x text, never exponential. Backtracking
// over each '*' took time exponential in the number of stars: a rule like
// "*a*a*a*a*a*a*a*a*a*a*b" against 60 bytes of "a", or a policy path with a
// few stars against a long request path sent from inside an environment,
// held a thread and a CPU of moatd for minutes and more (found while writing
// fuzz/permissions.cc; its corpus keeps such inputs).
bool globMatch(const std::string& pattern, const std::string& text, bool segments) {
  enum class Kind : unsigned char { kLiteral, kOne, kStar, kDoubleStar };
  struct Token {
    Kind kind;
    char c;
  };
  std::vector<Token> tokens;
  tokens.reserve(pattern.size());
  for (size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '*') {
      // "**" crosses '/' only when matching paths; elsewhere it is "*" twice.
      bool doubleStar = segments && i + 1 < pattern.size() && pattern[i + 1] == '*';
      tokens.push_back({doubleStar ? Kind::kDoubleStar : Kind::kStar, 0});
      if (doubleStar) ++i;
    } else if (c == '?') {
      tokens.push_back({Kind::kOne, 0});
    } else {
      if (c == '\\' && i + 1 < pattern.size()) c = pattern[++i];
      tokens.push_back({Kind::kLiteral, c});
    }
  }
  const size_t n = tokens.size();
  // at[i]: the text read so far can be followed by tokens i.. (at[n]: matched).
  std::vector<char> at(n + 1, 0), next(n + 1, 0);
  auto skipStars = [&](std::vector<char>& s) {  // a star may match nothing
    for (size_t i = 0; i < n; ++i) {
      if (s[i] && (tokens[i].kind == Kind::kStar || tokens[i].kind == Kind::kDoubleStar)) s[i + 1] = 1;
    }
  };
  at[0] = 1;
  skipStars(at);
  for (char c : text) {
    std::fill(next.begin(), next.end(), 0);
    bool alive = false;
    const bool slash = segments && c == '/';
    for (size_t i = 0; i < n; ++i) {
      if (!at[i]) continue;
      size_t to = n + 1;  // none
      switch (tokens[i].kind) {
        case Kind::kLiteral:
          if (c == tokens[i].c) to = i + 1;
          break;
        case Kind::kOne:
          if (!slash) to = i + 1;
          break;
        case Kind::kStar:
          if (!slash) to = i;
          break;
        case Kind::kDoubleStar:
          to = i;
          break;
      }
      if (to <= n) {
        next[to] = 1;
        alive = true;
      }
    }
    if (!alive) return false;
    skipStars(next);
    at.swap(next);
  }
  return at[n] != 0;
}

std::string globEscape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '*' || c == '?' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

bool argvMatch(const std::vector<std::string>& pats, const std::vector<std::string>& argv) {
  bool restWildcard = !pats.empty() && pats.back() == "*";
  size_t fixed = restWildcard ? pats.size() - 1 : pats.size();
  if (argv.size() < fixed || (!restWildcard && argv.size() != fixed)) return false;
  for (size_t i = 0; i < fixed; ++i) {
    const std::string& arg = argv[i];
    bool ok = globMatch(pats[i], arg, false);
    if (!ok && i == 0 && pats[i].find('/') == std::string::npos) {
      auto slash = arg.rfind('/');
      ok = globMatch(pats[i], slash == std::string::npos ? arg : arg.substr(slash + 1), false);
    }
    if (!ok) return false;
  }
  return true;
}

std::vector<std::string> judgedArgv(const std::string& program, std::vector<std::string> argv) {
  if (argv.empty()) return {program};
  argv[0] = program;
  return argv;
}

}  // namespace moat
