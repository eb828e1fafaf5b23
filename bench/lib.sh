# SPDX-License-Identifier: Apache-2.0
# Shared by the bench/ scripts (sourced, not run): the statistics they
# report.

# median: the median of the numbers on standard input, one a line.
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

# bracketed KVT CEIL: the median of each kvt run (a line of file KVT) over
# the mean of the ceiling runs before and after it (file CEIL, one line
# more than KVT: ceiling, kvt, ceiling, ..., ceiling); docs/benchmarks.md,
# "Bracketed rounds".
bracketed() {
    paste "$1" <(head -n -1 "$2") <(tail -n +2 "$2") | awk '{print $1 / (($2 + $3) / 2)}' | median
}
