"""What every part shares: the descriptor tree's rules, a request's answers, counter and
stats keys, the YAML readers, and the Algorithm protocol each rule kind implements."""
