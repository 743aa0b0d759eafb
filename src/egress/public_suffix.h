#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "common/result.h"

// The public suffix list (publicsuffix.org): the names under which anyone
// can register a domain of their own ("com", "co.uk", "github.io",
// "s3.amazonaws.com"). A secret's host glob must stay inside one registered
// domain (egress/secrets.cc), or the proxy would hand the secret to hosts
// of many owners.
//
// Why not libpsl (Debian's libpsl5, over the same list): it answers "is this
// a public suffix" and "what is this name's registrable domain", but not
// suffixBelow(): whether any suffix lies under a domain ("*.amazonaws.com"
// covers s3.amazonaws.com, which anyone can register under), which the
// check of a secret's glob needs. Its compiled list cannot be walked. The
// text list is read from /usr/share/publicsuffix, the file libpsl's own
// package builds from.
namespace moat::egress {

class PublicSuffixList {
 public:
  // The list's text format: one rule per line ("co.uk", "*.ck" for every
  // name directly under ck, "!www.ck" for an exception), "//" comments.
  // Rules in Unicode are kept in their ASCII (punycode) form, as hosts are.
  static PublicSuffixList parse(std::string_view text);
  static Result<PublicSuffixList> load(const std::string& path);

  // `domain` (lower case, ASCII) is a public suffix. A single label always
  // is (the list's implicit "*" rule).
  bool isPublicSuffix(const std::string& domain) const;
  // A public suffix lies strictly below `domain` ("amazonaws.com" holds
  // "s3.amazonaws.com"): one example of it, or "" when none does.
  std::string suffixBelow(const std::string& domain) const;
  size_t size() const { return rules_; }

 private:
  std::unordered_set<std::string> exact_;
  std::unordered_set<std::string> wildcard_;  // "ck" for the rule "*.ck"
  std::unordered_set<std::string> exception_;
  std::unordered_map<std::string, std::string> below_;  // a domain -> a suffix under it
  size_t rules_ = 0;
};

// The system's list: $MOAT_PUBLIC_SUFFIX_LIST, else Debian's publicsuffix
// package (/usr/share/publicsuffix/public_suffix_list.dat); read once per
// path. An error names the file when it cannot be read.
const Result<PublicSuffixList>& systemPublicSuffixes();

// One label in Unicode (UTF-8) as its ASCII form ("bücher" ->
// "xn--bcher-kva", RFC 3492); an ASCII label comes back as it is. Empty
// for text that is not UTF-8.
std::string asciiLabel(std::string_view utf8);

}  // namespace moat::egress
